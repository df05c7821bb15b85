// pagedkv-llama: answers prompts with a LLaMA-family GGUF model on the CPU through the engine.
//   pagedkv-llama --chat --prompt "What is the capital of France?"
//   pagedkv-llama --bench --bench-requests 16 --bench-shared-prefix 64
// A single prompt (n = 1, no beams) streams its text; several prompts, n > 1 or beams print each
// completion when all are done. --bench serves a synthetic ShareGPT-like workload instead and prints
// its throughput and KV cache figures. Statistics and progress go to stderr.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "bench.hpp"
#include "bench_workload.hpp"
#include "byte_size.hpp"
#include "engine.hpp"
#include "gguf.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "tokenizer.hpp"

using namespace pagedkv::llama;

namespace {

std::vector<std::string> read_prompts_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open the prompts file");
  std::vector<std::string> prompts;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) prompts.push_back(line);
  if (prompts.empty()) throw std::runtime_error(path + ": no prompts (one per non-empty line)");
  return prompts;
}

/// CLI11 transform: a size with units ("512MiB") to its byte count; CLI11 names the option in the error.
CLI::Validator byte_size_transform() {
  return CLI::Validator(
      [](std::string& text) {
        try {
          text = std::to_string(parse_byte_size(text));
          return std::string();
        } catch (const std::invalid_argument& error) {
          return std::string(error.what());
        }
      },
      "SIZE");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"pagedkv-llama: a LLaMA serving engine on the CPU built from pagedkv"};
  std::string model_path = PAGEDKV_DEFAULT_MODEL;
  std::string prompt, prompts_file;
  bool chat = false, no_prefix_caching = false, ignore_eos = false, bench = false;
  sampling_params params{.max_tokens = 128};
  engine_options options;
  std::int32_t kv_cache_tokens = 16384;
  std::uint64_t kv_cache_bytes = 0;  // 0: size the cache by kv_cache_tokens
  // --bench defaults: the simulator's lengths at a quarter (prompt cap 1024 -> 256), outputs capped at
  // 64, 16 requests: about 30 s on the 2-core development VM with SmolLM2-135M (examples/llama/README.md).
  bench_workload_options workload{.max_prompt_tokens = 256, .length_scale = 0.25};
  constexpr std::int32_t bench_default_max_tokens = 64;
  std::string preemption_mode = "recompute";
  app.add_option("--model", model_path, "GGUF model file (default: SmolLM2-135M-Instruct Q4_1 from scripts/fetch-model.sh)");
  app.add_option("--prompt", prompt, "The prompt");
  app.add_option("--prompts-file", prompts_file, "A file of prompts, one per line, served as one batch")->check(CLI::ExistingFile);
  app.add_flag("--chat", chat, "Wrap each prompt as a user message of the model's chat template (ChatML)");
  app.add_option("-n", params.n, "Parallel samples per prompt")->check(CLI::Range(1, 64));
  app.add_option("--beam-width", params.beam_width, "Beam search of this width (0: sampling)")->check(CLI::Range(0, 64));
  CLI::Option* max_tokens_option =
      app.add_option("--max-tokens", params.max_tokens,
                     "Generated tokens per sample (default 128); with --bench, the cap on drawn output lengths (default 64)")
          ->check(CLI::Range(1, 1 << 20));
  app.add_option("--temperature", params.temperature, "Sampling temperature; 0 is greedy")->check(CLI::Range(0.0f, 100.0f));
  app.add_option("--top-k", params.top_k, "Sample among the k most likely tokens (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", params.top_p, "Nucleus sampling mass")->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--seed", params.seed, "Seed of each request's sampler");
  app.add_option("--stop", params.stop, "Stop strings (repeatable)");
  app.add_flag("--ignore-eos", ignore_eos, "Generate max-tokens even past the end-of-sequence token");
  app.add_option("--block-size", options.block_size, "KV cache block size in tokens")->check(CLI::Range(1, 256));
  CLI::Option* tokens_option =
      app.add_option("--kv-cache-tokens", kv_cache_tokens, "KV cache capacity in tokens (default 16384)")
          ->check(CLI::PositiveNumber);
  app.add_option("--kv-cache-memory", kv_cache_bytes,
                 "KV cache capacity in bytes, instead of --kv-cache-tokens: 512MiB, 2GiB, 1000000 (units B, kB, MB, GB, "
                 "TB, KiB, MiB, GiB, TiB)")
      ->transform(byte_size_transform())
      ->excludes(tokens_option);
  app.add_option("--max-batch-tokens", options.max_tokens_per_step, "Token budget of one step (chunks long prompts)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--no-prefix-caching", no_prefix_caching, "Disable automatic prefix caching");
  app.add_option("--preemption", preemption_mode, "What happens to requests that no longer fit")
      ->check(CLI::IsMember({"recompute", "swap"}));
  CLI::Option* bench_option = app.add_flag(
      "--bench", bench,
      "Serve a synthetic ShareGPT-like workload (random prompt ids, EOS ignored, output lengths as drawn, capped by "
      "--max-tokens) and print throughput and KV cache figures");
  bench_option->excludes("--prompt")->excludes("--prompts-file")->excludes("--chat");
  app.add_option("--bench-requests", workload.num_requests, "Requests of the --bench workload (default 16)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--bench-max-prompt", workload.max_prompt_tokens, "Longest --bench prompt in tokens (default 256)")
      ->check(CLI::PositiveNumber);
  app.add_option("--bench-length-scale", workload.length_scale,
                 "Multiplies the drawn ShareGPT-like lengths of --bench (default 0.25: means 40 prompt, 84 output tokens)")
      ->check(CLI::Range(1e-3, 100.0));
  app.add_option("--bench-shared-prefix", workload.shared_prefix_tokens,
                 "Tokens of a system prompt shared by every --bench prompt (default 0)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    std::vector<std::string> prompts;
    if (!prompt.empty()) prompts.push_back(prompt);
    if (!prompts_file.empty())
      for (std::string& p : read_prompts_file(prompts_file)) prompts.push_back(std::move(p));
    if (prompts.empty() && !bench) throw std::runtime_error("nothing to do: give --prompt, --prompts-file or --bench");
    params.ignore_eos = ignore_eos;
    options.enable_prefix_caching = !no_prefix_caching;
    options.preemption = preemption_mode == "swap" ? preemption::swap : preemption::recompute;

    const auto load_start = std::chrono::steady_clock::now();
    const gguf_file file = gguf_file::open(model_path);
    const llama_config config = config_from_gguf(file);
    const llama_weights weights = load_llama_weights(file, config);
    const tokenizer tok = tokenizer::from_gguf(file);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();

    const std::size_t block_bytes = kv_cache_bytes_per_block(config, options.block_size);
    options.num_blocks = kv_cache_bytes > 0 ? kv_cache_blocks_for_bytes(config, options.block_size, kv_cache_bytes)
                                            : (kv_cache_tokens + options.block_size - 1) / options.block_size;
    if (options.num_blocks < 1)
      throw std::runtime_error("--kv-cache-memory " + std::to_string(kv_cache_bytes) + " holds no block of " +
                               std::to_string(options.block_size) + " tokens (" + std::to_string(block_bytes) +
                               " bytes each for this model)");
    std::cerr << "[pagedkv-llama] load " << load_s << " s; KV cache " << options.num_blocks << " blocks of "
              << options.block_size << " tokens = " << std::int64_t(options.num_blocks) * options.block_size
              << " tokens, " << format_byte_size(std::uint64_t(options.num_blocks) * block_bytes) << " ("
              << block_bytes / std::size_t(options.block_size) << " bytes per token)\n";

    engine e(config, weights, &tok, options);
    if (bench) {
      workload.max_output_tokens = max_tokens_option->count() > 0 ? params.max_tokens : bench_default_max_tokens;
      workload.context_tokens = std::int32_t(std::min<std::int64_t>(config.context_length, 1 << 30));
      workload.vocab_size = std::int32_t(config.vocab_size);
      workload.seed = params.seed;
      const std::vector<bench_request> requests = make_bench_workload(workload);
      std::cout << "pagedkv-llama --bench: " << workload.num_requests << " ShareGPT-like requests (seed " << workload.seed
                << ", lengths x" << workload.length_scale << ", prompts <= " << workload.max_prompt_tokens << " tokens, " << workload.shared_prefix_tokens
                << " shared; outputs <= " << workload.max_output_tokens << "), block size " << options.block_size
                << ", prefix caching " << (options.enable_prefix_caching ? "on" : "off") << ", preemption "
                << preemption_mode << "\n";
      print_bench_result(std::cout, run_bench(e, requests, params, stderr));
      return 0;
    }
    std::vector<pagedkv::request_id> ids;
    std::int64_t prompt_tokens = 0;
    for (const std::string& p : prompts) {
      const std::vector<chat_message> messages = {{"user", p}};
      std::vector<pagedkv::token_id> ids_of_prompt;
      if (tok.add_bos()) ids_of_prompt.push_back(tok.bos_id());
      const std::vector<pagedkv::token_id> text_ids = tok.encode(chat ? format_chatml(messages) : p);
      ids_of_prompt.insert(ids_of_prompt.end(), text_ids.begin(), text_ids.end());
      prompt_tokens += std::int64_t(ids_of_prompt.size());
      ids.push_back(e.add_request(std::move(ids_of_prompt), params));
    }
    const bool streaming = prompts.size() == 1 && params.n == 1 && params.beam_width == 0;
    if (streaming)
      e.on_stream([](const stream_event& ev) {
        std::fwrite(ev.text.data(), 1, ev.text.size(), stdout);
        std::fflush(stdout);
      });

    const auto start = std::chrono::steady_clock::now();
    e.run();
    const double run_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::int64_t generated = 0;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const request_result& r = e.result(ids[i]);
      if (r.rejected) std::cerr << "prompt " << i << ": rejected, it does not fit in the KV cache\n";
      for (std::size_t j = 0; j < r.completions.size(); ++j) {
        const completion& c = r.completions[j];
        generated += std::int64_t(c.tokens.size());
        if (streaming) continue;
        std::cout << "=== prompt " << i << (params.beam_width > 0 ? ", beam " : ", sample ") << j << " (" << to_string(c.reason)
                  << ", logprob " << c.logprob << ")\n"
                  << c.text << "\n";
      }
    }
    if (streaming) std::cout << "\n";
    std::cerr << "[pagedkv-llama] " << prompts.size() << " prompts, " << prompt_tokens
              << " prompt tokens, " << generated << " generated in " << run_s << " s ("
              << (run_s > 0 ? double(generated) / run_s : 0.0) << " tokens/s); preemptions " << e.num_preemptions() << "\n";
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "pagedkv-llama: " << error.what() << "\n";
    if (model_path == PAGEDKV_DEFAULT_MODEL) std::cerr << "(the default model is fetched by scripts/fetch-model.sh)\n";
    return 1;
  }
}
