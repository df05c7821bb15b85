// pagedkv-llama: answers prompts with a LLaMA-family GGUF model on the CPU through the engine.
//   pagedkv-llama --chat --prompt "What is the capital of France?"
//   pagedkv-llama --bench --bench-requests 16 --bench-shared-prefix 64
//   pagedkv-llama serve --port 8000   (an OpenAI-compatible HTTP server: serve.hpp)
// A single prompt (n = 1, no beams) streams its text; several prompts, n > 1 or beams print each
// completion when all are done. --bench serves a synthetic ShareGPT-like workload instead and prints
// its throughput and KV cache figures. Statistics and progress go to stderr.
// Options, prompts and the cache size are checked before the weights load; the exit status tells a
// refused command line (2) and a request that cannot fit in the KV cache (3) from a failure (1).
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "bench.hpp"
#include "bench_workload.hpp"
#include "byte_size.hpp"
#include "chat_template.hpp"
#include "cli_checks.hpp"
#include "engine.hpp"
#include "gguf.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "model_backend.hpp"
#include "serve.hpp"
#include "cuda/cuda_backend.hpp"
#include "cuda/tp_backend.hpp"
#include "sharding.hpp"
#include "tp_report.hpp"
#include "tokenizer.hpp"

using namespace pagedkv::llama;

namespace {

constexpr double max_int32 = 2147483647.0;

std::string plural(std::int64_t count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

/// A --tune-gemms file: its "target" line (the GPU and cuBLASLt it was tuned on, cuda_gemm_target;
/// empty in a file written by hand without one) and a line "n in out f32_out index" per product off
/// the heuristic's first choice, each shape once ('#' starts a comment).
struct gemm_choices_file {
  std::string target;
  std::vector<pagedkv::llama::cuda::gemm_choice> choices;
};

gemm_choices_file read_gemm_choices(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw cli::error(cli::exit_status::bad_usage, "--tune-gemms " + path + ": cannot read");
  gemm_choices_file read;
  std::string line;
  const auto refuse = [&](int number, const std::string& why) {
    throw cli::error(cli::exit_status::bad_usage,
                     "--tune-gemms " + path + ": line " + std::to_string(number) + " " + why + ": " + line);
  };
  for (int number = 1; std::getline(file, line); ++number) {
    line = line.substr(0, line.find('#'));
    const std::size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    if (line.compare(first, 7, "target ") == 0) {
      if (!read.target.empty()) refuse(number, "is a second target");
      const std::size_t from = line.find_first_not_of(" \t", first + 7), to = line.find_last_not_of(" \t\r") + 1;
      read.target = from < to ? line.substr(from, to - from) : "";
      if (read.target.empty()) refuse(number, "names no target");
      continue;
    }
    std::istringstream fields(line);
    pagedkv::llama::cuda::gemm_choice c;
    int f32 = 0;
    std::string rest;
    if (!(fields >> c.n >> c.in >> c.out >> f32 >> c.index) || (fields >> rest) || c.n < 1 || c.in < 1 || c.out < 1 ||
        (f32 != 0 && f32 != 1) || c.index < 0)
      refuse(number, "is not \"n in out f32_out index\" (positive sizes, f32_out 0 or 1, index >= 0)");
    c.f32_out = f32 == 1;
    for (const auto& earlier : read.choices)
      if (earlier.n == c.n && earlier.in == c.in && earlier.out == c.out && earlier.f32_out == c.f32_out)
        refuse(number, "repeats a shape given before");
    read.choices.push_back(c);
  }
  return read;
}

void write_gemm_choices(const std::string& path, const std::string& target,
                        const std::vector<pagedkv::llama::cuda::gemm_choice>& choices) {
  std::ofstream file(path);
  file << "# pagedkv-llama --tune-gemms: n in out f32_out index (cuBLASLt's heuristic candidate; this GPU and cuBLASLt only)\n"
       << "target " << target << '\n';
  for (const auto& c : choices) file << c.n << ' ' << c.in << ' ' << c.out << ' ' << int(c.f32_out) << ' ' << c.index << '\n';
  if (!file.flush()) throw cli::error(cli::exit_status::failure, "--tune-gemms " + path + ": cannot write");
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
  if (argc > 1 && std::string_view(argv[1]) == "serve") return serve_main(argc - 1, argv + 1);
  CLI::App app{"pagedkv-llama: a LLaMA serving engine on the CPU or a GPU built from pagedkv"};
  app.option_defaults()->always_capture_default();
  app.footer("Exit status: 0 done; 1 a failure (a model that cannot be loaded); 2 a refused option or prompt; 3 a "
             "request that cannot fit in the KV cache (what it generated is printed). `pagedkv-llama serve --help`: the "
             "OpenAI-compatible HTTP server.");
  std::string model_path = PAGEDKV_DEFAULT_MODEL;
  std::string prompt, prompts_file, system_prompt, chat_template_name;
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
  std::string device = "cpu";
  std::string model_shape, kv_cache_dtype, workload_out;
  double gpu_memory_utilization = 0.9;
  bool enforce_eager = false;
  bool tensor_parallel_timed_graphs = false;
  bool tensor_parallel_nccl_all_reduce = false;
  std::int32_t tensor_parallel_size = 1;
  std::vector<std::int64_t> profile_steps;
  std::string tune_gemms_file;
  int tune_gemm_candidates = 5;
  app.add_option("--model", model_path, "GGUF model file (the default, SmolLM2-135M-Instruct Q4_1, is fetched by "
                                       "scripts/fetch-model.sh), or a Hugging Face model folder (config.json and "
                                       "model.safetensors or its shards; no tokenizer: --bench only)")
      ->check(CLI::ExistingPath);
  app.add_option("--device", device, "Where the model runs (default cpu)")
      ->check(CLI::IsMember(std::vector<std::string>(model_backend_devices().begin(), model_backend_devices().end())));
  app.add_option("--model-shape", model_shape,
                     "Instead of --model, random bf16 weights of this shape made on the GPU: llama2-7b, llama3-8b, "
                     "llama2-13b; NAME@tp2, rank 0's shard of NAME at --tensor-parallel-size 2 alone on one GPU (the "
                     "TP step's compute without its communication). Timing only (with --device cuda --bench): the "
                     "text is noise")
          ->check(CLI::IsMember({"llama2-7b", "llama3-8b", "llama2-13b", "llama2-7b@tp2", "llama3-8b@tp2",
                                 "llama2-13b@tp2"}))
          ->excludes("--model");
  app.add_option("--kv-cache-dtype", kv_cache_dtype, "KV cache element type: the device's default (cpu f32, cuda bf16), "
                                                     "bf16 or fp8 (e4m3; cuda only)")
      ->check(CLI::IsMember({"bf16", "fp8"}));
  app.add_option("--tensor-parallel-size", tensor_parallel_size,
                 "GPUs the model is sharded over by tensor parallelism (1, 2 or 4; with --device cuda; NCCL is "
                 "opened at run time: libnccl.so.2 on LD_LIBRARY_PATH or PAGEDKV_NCCL_LIBRARY)")
      ->check(CLI::IsMember({1, 2, 4}));
  CLI::Option* utilization_option =
      app.add_option("--gpu-memory-utilization", gpu_memory_utilization,
                     "With --device cuda and no --kv-cache-tokens or --kv-cache-memory: the fraction of the GPU's memory "
                     "this process may use; the KV cache takes what the weights leave of it")
          ->check(cli::number_in({0.01}, {1.0}));
  app.add_flag("--enforce-eager", enforce_eager,
               "With --device cuda: launch every step's kernels instead of replaying the CUDA graphs captured for "
               "decode steps (vLLM's flag; with --tensor-parallel-size, on every rank)");
  app.add_flag("--tensor-parallel-timed-graphs", tensor_parallel_timed_graphs,
               "With --tensor-parallel-size 2 or 4: time the NCCL collectives captured in decode graphs too (CUDA "
               "events in the graphs: slower steps, docs/design.md); without it the --bench all-reduce figures "
               "count the eagerly launched steps only")
      ->excludes("--enforce-eager");
  app.add_flag("--tensor-parallel-nccl-all-reduce", tensor_parallel_nccl_all_reduce,
               "With --tensor-parallel-size 2 or 4: all-reduce O's and down's products with NCCL, then add and "
               "normalize, instead of the kernel that receives the other GPUs' products over NVLink and adds and "
               "normalizes in one (docs/design.md)");
  app.add_option("--profile-steps", profile_steps,
                 "With --model-shape on one GPU: the steps (0-based, comma-separated) whose kernels lie between "
                 "cudaProfilerStart and cudaProfilerStop, for `ncu --profile-from-start off`")
      ->delimiter(',')
      ->check(CLI::NonNegativeNumber);
  CLI::Option* tune_gemms_option = app.add_option(
      "--tune-gemms", tune_gemms_file,
      "With --model-shape on one GPU: each decode graph batch of 64 or more sequences runs its products with the "
      "cuBLASLt candidates (of the heuristic's first --tune-gemm-candidates) that made its whole captured step "
      "fastest. An existing FILE gives the choices (refused if tuned on another GPU or cuBLASLt); otherwise this run "
      "tunes them (slower: its figures are not the engine's) and writes FILE, for later runs on the same GPU and "
      "cuBLASLt");
  CLI::Option* tune_gemm_candidates_option =
      app.add_option("--tune-gemm-candidates", tune_gemm_candidates,
                     "With --tune-gemms, when it tunes: how many of the heuristic's candidates each product tries")
          ->check(CLI::Range(2, 16))
          ->needs(tune_gemms_option);
  app.add_option("--prompt", prompt, "The prompt");
  app.add_option("--prompts-file", prompts_file, "A file of prompts, one per line, served as one batch")->check(CLI::ExistingFile);
  CLI::Option* chat_option = app.add_flag(
      "--chat", chat,
      "Wrap each prompt as a user message of the model's chat template, the file's tokenizer.chat_template told "
      "by its markers: chatml, llama2, llama3 or mistral");
  app.add_option("--chat-template", chat_template_name,
                 "With --chat, this format instead of the file's template (its plain form: chatml without a default "
                 "system prompt)")
      ->check(CLI::IsMember(std::vector<std::string>(chat_format_names.begin(), chat_format_names.end())))
      ->needs(chat_option);
  app.add_option("--system", system_prompt, "With --chat, a system message before each prompt")->needs(chat_option);
  app.add_option("-n", params.n, "Parallel samples per prompt")->check(CLI::Range(1, 64));
  app.add_option("--beam-width", params.beam_width, "Beam search of this width (0: sampling)")->check(CLI::Range(0, 64));
  CLI::Option* max_tokens_option =
      app.add_option("--max-tokens", params.max_tokens,
                     "Generated tokens per sample; with --bench, the cap on drawn output lengths (default there 64)")
          ->check(CLI::Range(1, 1 << 20));
  app.add_option("--temperature", params.temperature, "Sampling temperature; 0 is greedy")
      ->check(cli::number_in({0.0}, {100.0}));
  app.add_option("--top-k", params.top_k, "Sample among the k most likely tokens (0: all)")
      ->check(cli::number_in({0.0}, {max_int32}));
  app.add_option("--top-p", params.top_p, "Nucleus sampling: the smallest set of tokens whose probability reaches this")
      ->check(cli::number_in({0.0, false}, {1.0}));
  app.add_option("--seed", params.seed, "Seed of each request's sampler");
  app.add_option("--stop", params.stop, "Stop strings (repeatable)");
  app.add_flag("--ignore-eos", ignore_eos, "Generate max-tokens even past the end-of-sequence token");
  app.add_option("--block-size", options.block_size, "KV cache block size in tokens")->check(CLI::Range(1, 256));
  CLI::Option* tokens_option =
      app.add_option("--kv-cache-tokens", kv_cache_tokens, "KV cache capacity in tokens")
          ->check(cli::number_in({1.0}, {max_int32}));
  app.add_option("--kv-cache-memory", kv_cache_bytes,
                 "KV cache capacity in bytes, instead of --kv-cache-tokens: 512MiB, 2GiB, 1000000 (units B, kB, MB, GB, "
                 "TB, KiB, MiB, GiB, TiB); 0: by --kv-cache-tokens")
      ->transform(byte_size_transform())
      ->excludes(tokens_option);
  app.add_option("--max-batch-tokens", options.max_tokens_per_step, "Token budget of one step (chunks long prompts)")
      ->check(cli::number_in({1.0}, {max_int32}));
  app.add_option("--max-num-seqs", options.max_num_seqs, "Sequences one step may run")
      ->check(cli::number_in({1.0}, {65536.0}));
  app.add_flag("--no-prefix-caching", no_prefix_caching, "Disable automatic prefix caching");
  bool no_window_freeing = false;
  app.add_flag("--no-window-freeing", no_window_freeing,
               "A model with sliding windows: keep every KV block instead of releasing those wholly out of a window");
  bool no_async_scheduling = false;
  app.add_flag("--no-async-scheduling", no_async_scheduling,
               "Plan each step only after the previous step's tokens are back, instead of while the device runs it");
  app.add_option("--preemption", preemption_mode, "What happens to requests that no longer fit")
      ->check(CLI::IsMember({"recompute", "swap"}));
  CLI::Option* bench_option = app.add_flag(
      "--bench", bench,
      "Serve a synthetic ShareGPT-like workload (random prompt ids, EOS ignored, output lengths as drawn, capped by "
      "--max-tokens) and print throughput and KV cache figures");
  bench_option->excludes("--prompt")->excludes("--prompts-file")->excludes("--chat");
  app.add_option("--bench-requests", workload.num_requests, "Requests of the --bench workload")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--bench-max-prompt", workload.max_prompt_tokens, "Longest --bench prompt in tokens")
      ->check(cli::number_in({1.0}, {max_int32}));
  app.add_option("--bench-length-scale", workload.length_scale,
                 "Multiplies the drawn ShareGPT-like lengths of --bench (0.25: means of 40 prompt, 84 output tokens)")
      ->check(cli::number_in({1e-3}, {100.0}));
  app.add_option("--bench-workload-out", workload_out,
                 "Write the --bench requests to this file as JSON ([{\"prompt\": [ids], \"output_tokens\": n}]), "
                 "for a peer to serve the same ones (bench/engine/hf_peer.py)")
      ->needs(bench_option);
  app.add_option("--bench-shared-prefix", workload.shared_prefix_tokens,
                 "Tokens of a system prompt shared by every --bench prompt")
      ->check(cli::number_in({0.0}, {max_int32}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : int(cli::exit_status::bad_usage);  // exit() prints the help or the error
  }

  using cli::exit_status;
  try {
    std::vector<cli::prompt_input> prompts;
    if (!prompt.empty()) prompts.push_back({prompt, "--prompt"});
    if (!prompts_file.empty())
      for (cli::prompt_input& p : cli::read_prompts_file(prompts_file)) prompts.push_back(std::move(p));
    if (prompts.empty() && !bench)
      throw cli::error(exit_status::bad_usage, "nothing to do: give --prompt, --prompts-file or --bench");
    const bool hf_folder = model_shape.empty() && std::filesystem::is_directory(model_path);
    if (hf_folder && !std::filesystem::exists(std::filesystem::path(model_path) / "config.json"))
      throw cli::error(exit_status::bad_usage, "--model " + model_path +
                                                   ": a folder without config.json: give a GGUF file or a Hugging Face model folder");
    if (hf_folder && !bench)
      throw cli::error(exit_status::bad_usage, "--model " + model_path +
                                                   ": a Hugging Face folder brings no tokenizer here: serve it with --bench");
    if (!model_shape.empty() && (device != "cuda" || !bench))
      throw cli::error(exit_status::bad_usage, "--model-shape " + model_shape +
                                                   ": random weights are for timing: they need --device cuda and --bench");
    if (device != "cuda" && utilization_option->count() > 0)
      throw cli::error(exit_status::bad_usage, "--gpu-memory-utilization needs --device cuda");
    // The options' own errors (and a --tune-gemms file's) before the GPU is looked for.
    const bool tensor_parallel = tensor_parallel_size > 1;
    if (!profile_steps.empty() && (model_shape.empty() || tensor_parallel))
      throw cli::error(exit_status::bad_usage, "--profile-steps needs --model-shape on one GPU");
    std::sort(profile_steps.begin(), profile_steps.end());
    if (!tune_gemms_file.empty() && (model_shape.empty() || tensor_parallel))
      throw cli::error(exit_status::bad_usage, "--tune-gemms needs --model-shape on one GPU");
    const bool tune_gemms = !tune_gemms_file.empty() && !std::filesystem::exists(tune_gemms_file);
    if (tune_gemms) {  // the choices are written at the end: a folder that is not there would lose the run
      const std::filesystem::path folder = std::filesystem::absolute(tune_gemms_file).parent_path();
      if (!std::filesystem::is_directory(folder))
        throw cli::error(exit_status::bad_usage, "--tune-gemms " + tune_gemms_file + ": no folder " + folder.string() +
                                                     " to write it in");
    }
    if (!tune_gemms_file.empty() && !tune_gemms && tune_gemm_candidates_option->count() > 0)
      throw cli::error(exit_status::bad_usage, "--tune-gemm-candidates: --tune-gemms " + tune_gemms_file +
                                                   " exists, so this run reads its choices and tunes nothing "
                                                   "(remove it to tune again)");
    if (tune_gemms && enforce_eager)
      throw cli::error(exit_status::bad_usage, "--tune-gemms " + tune_gemms_file +
                                                   ": no such file to read, and tuning times decode graphs, which "
                                                   "--enforce-eager turns off");
    const gemm_choices_file gemm_choices =
        tune_gemms_file.empty() || tune_gemms ? gemm_choices_file{} : read_gemm_choices(tune_gemms_file);
    if (device == "cuda")
      if (std::string why; !cuda_backend_available(&why)) throw cli::error(exit_status::failure, "--device cuda: " + why);
    if (!gemm_choices.target.empty() && gemm_choices.target != cuda_gemm_target())
      throw cli::error(exit_status::bad_usage, "--tune-gemms " + tune_gemms_file + ": tuned on " + gemm_choices.target +
                                                   ", not this " + cuda_gemm_target() +
                                                   " (its candidate indices name other algorithms): remove it to tune "
                                                   "again");
    if (tensor_parallel && device != "cuda")
      throw cli::error(exit_status::bad_usage, "--tensor-parallel-size needs --device cuda");
    if (tensor_parallel_timed_graphs && !tensor_parallel)
      throw cli::error(exit_status::bad_usage, "--tensor-parallel-timed-graphs needs --tensor-parallel-size 2 or 4");
    if (tensor_parallel_nccl_all_reduce && !tensor_parallel)
      throw cli::error(exit_status::bad_usage, "--tensor-parallel-nccl-all-reduce needs --tensor-parallel-size 2 or 4");
    if (tensor_parallel)
      if (std::string why; !tensor_parallel_available(tensor_parallel_size, &why))
        throw cli::error(exit_status::failure, "--tensor-parallel-size " + std::to_string(tensor_parallel_size) + ": " + why);
    // A --model that names no file is refused by the option check; only the default can be missing.
    if (model_shape.empty() && !std::filesystem::exists(model_path))
      throw cli::error(exit_status::failure,
                       model_path + ": no such file (the default model is fetched by scripts/fetch-model.sh)");
    params.ignore_eos = ignore_eos;
    options.enable_prefix_caching = !no_prefix_caching;
    options.async_scheduling = !no_async_scheduling;
    options.free_outside_window = !no_window_freeing;
    options.preemption = preemption_mode == "swap" ? pagedkv::preemption_mode::swap : pagedkv::preemption_mode::recompute;

    const auto load_start = std::chrono::steady_clock::now();
    // --model-shape: no file; random weights made by the CUDA backend, no tokenizer.
    // A Hugging Face folder: config.json and safetensors, loaded whole (weights included) here.
    std::optional<hf_checkpoint> checkpoint = hf_folder ? std::optional(load_hf_checkpoint(model_path)) : std::nullopt;
    const std::optional<gguf_file> file =
        model_shape.empty() && !hf_folder ? std::optional(gguf_file::open(model_path)) : std::nullopt;
    const llama_config config = file         ? config_from_gguf(*file)
                                : checkpoint ? checkpoint->config
                                             : *named_model_shape(model_shape);
    const std::optional<tokenizer> tok = file ? std::optional(tokenizer::from_gguf(*file)) : std::nullopt;
    std::optional<tensor_parallel_plan> plan;  // refused before the weights load when the model does not split
    try {
      if (tensor_parallel) plan = make_tensor_parallel_plan(config, tensor_parallel_size);
    } catch (const pagedkv::error& e) {
      throw cli::error(exit_status::bad_usage, std::string("--tensor-parallel-size: ") + e.what());
    }

    // Every prompt is encoded and checked against the model's context before the weights load.
    std::optional<chat_template> chat_prompt_template;
    if (chat && chat_template_name.empty()) chat_prompt_template = chat_template::from_gguf(*file, *tok);
    if (chat && !chat_template_name.empty())
      chat_prompt_template = chat_template::named(*chat_format_from_name(chat_template_name),
                                         tok->bos_id() >= 0 ? tok->token_text(tok->bos_id()) : std::string(),
                                         tok->eos_id() >= 0 ? tok->token_text(tok->eos_id()) : std::string());
    if (chat_prompt_template && chat_prompt_template->format == chat_format::mistral && !system_prompt.empty())
      throw cli::error(exit_status::bad_usage, "--system: the mistral chat format has no system role");
    std::vector<std::vector<pagedkv::token_id>> prompt_ids;
    for (const cli::prompt_input& p : prompts) {
      // SmolLM2's byte-level vocabulary has no token for a few control bytes: they encode to nothing.
      if (tok->encode(p.text).empty())
        throw cli::error(exit_status::bad_usage, p.source + ": the prompt (" + plural(std::int64_t(p.text.size()), "byte") +
                                                     ") has no character in the model's vocabulary: it encodes to no token");
      std::vector<pagedkv::token_id> ids;
      if (!chat_prompt_template && tok->add_bos()) ids.push_back(tok->bos_id());  // a chat template writes its own BOS
      std::vector<chat_message> messages;
      if (!system_prompt.empty()) messages.push_back({"system", system_prompt});
      messages.push_back({"user", p.text});
      const std::vector<pagedkv::token_id> text_ids = tok->encode(chat_prompt_template ? chat_prompt_template->render(messages) : p.text);
      ids.insert(ids.end(), text_ids.begin(), text_ids.end());
      const std::int64_t length = std::int64_t(ids.size()), context = config.context_length;
      if (length > context)
        throw cli::error(exit_status::bad_usage, p.source + ": the prompt is " + plural(length, "token") +
                                                     ", longer than the model's context of " + plural(context, "token"));
      if (length + params.max_tokens > context)
        throw cli::error(exit_status::bad_usage,
                         p.source + ": " + plural(length, "prompt token") + " and --max-tokens " +
                             std::to_string(params.max_tokens) + " exceed the model's context of " +
                             plural(context, "token") + ": ask for " + std::to_string(context - length) +
                             " tokens at most");
      prompt_ids.push_back(std::move(ids));
    }
    if (chat_prompt_template)
      std::cerr << "[pagedkv-llama] --chat: " << chat_prompt_template->describe()
                << (chat_template_name.empty() ? " (the file's tokenizer.chat_template)" : " (--chat-template)") << "\n";
    const llama_weights weights = file         ? load_llama_weights(*file, config)
                                  : checkpoint ? std::move(checkpoint->weights)
                                               : llama_weights{};
    const bool has_weights = file || checkpoint;
    std::optional<pagedkv::kernels::dtype> kv_dtype;
    if (kv_cache_dtype == "bf16") kv_dtype = pagedkv::kernels::dtype::bf16;
    if (kv_cache_dtype == "fp8") kv_dtype = pagedkv::kernels::dtype::fp8_e4m3;
    std::unique_ptr<model_backend> backend =
        tensor_parallel ? make_tensor_parallel_backend(config, has_weights ? &weights : nullptr,
                                                       {.size = tensor_parallel_size,
                                                        .kv_dtype = kv_dtype.value_or(pagedkv::kernels::dtype::bf16),
                                                        .cuda_graphs = !enforce_eager,
                                                        .time_graph_collectives = tensor_parallel_timed_graphs,
                                                        .peer_reduce = !tensor_parallel_nccl_all_reduce,
                                                        .peer_reduce_tokens = std::max(options.max_tokens_per_step, 256)})
        : has_weights ? make_model_backend(config, weights, {.device = device, .kv_dtype = kv_dtype, .enforce_eager = enforce_eager})
               : make_cuda_backend(config, nullptr, {.kv_dtype = kv_dtype.value_or(pagedkv::kernels::dtype::bf16),
                                                     .cuda_graphs = !enforce_eager,
                                                     .profile_steps = profile_steps,
                                                     .tune_gemm_candidates = tune_gemms ? tune_gemm_candidates : 0,
                                                     .gemm_choices = gemm_choices.choices});
    if (tensor_parallel && !tensor_parallel_nccl_all_reduce)  // e.g. GPUs without peer access to each other
      if (const tensor_parallel_stats s = tensor_parallel_stats_of(*backend); !s.peer_reduce)
        std::cerr << "[pagedkv-llama] tensor parallel: the peer reduce is " << s.peer_reduce_off
                  << "; O's and down's all-reduces go through NCCL\n";
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
    // The roofline's read ceiling, measured before the KV cache takes the memory.
    const double read_bytes_per_s = device == "cuda" && bench ? cuda_read_bytes_per_s() : 0.0;
    const std::size_t block_bytes = kv_bytes_per_block(*backend, options.block_size);
    // On the GPU, without a size given, the cache takes what the weights leave of the memory share.
    if (device == "cuda" && kv_cache_bytes == 0 && tokens_option->count() == 0) {
      kv_cache_bytes = tensor_parallel_kv_budget_bytes(*backend, gpu_memory_utilization);  // the tightest GPU's
      if (kv_cache_bytes == 0)
        throw cli::error(exit_status::bad_usage, "--gpu-memory-utilization " + std::to_string(gpu_memory_utilization) +
                                                     " leaves no GPU memory for the KV cache once the weights are loaded");
    }
    options.num_blocks = kv_cache_bytes > 0 ? kv_blocks_for_bytes(*backend, options.block_size, kv_cache_bytes)
                                            : 0;
    // In 64 bits: --kv-cache-tokens 2147483647 rounded up to whole blocks overflows an int32.
    const std::int64_t num_blocks = kv_cache_bytes > 0 ? options.num_blocks
                                                       : (std::int64_t(kv_cache_tokens) + options.block_size - 1) / options.block_size;
    const std::string cache_option =
        kv_cache_bytes > 0 ? "--kv-cache-memory " + std::to_string(kv_cache_bytes) + " (" + format_byte_size(kv_cache_bytes) + ")"
                           : "--kv-cache-tokens " + std::to_string(kv_cache_tokens);
    if (num_blocks < 1)
      throw cli::error(exit_status::bad_usage, cache_option + " holds no block of " + plural(options.block_size, "token") +
                                                   " (" + std::to_string(block_bytes) + " bytes each for this model)");
    // Checked before the pools are allocated: a cache larger than the memory ran for a minute and
    // then ended in std::bad_alloc. Swap preemption adds a host pool as large as the device pool.
    const int pools = (preemption_mode == "swap" ? 1 : 0) + (device == "cuda" ? 0 : 1);  // host pools
    const std::uint64_t cache_bytes = std::uint64_t(num_blocks) * block_bytes * pools;  // < 2^31 * 2^32 * 2
    if (const std::optional<std::uint64_t> available = cli::available_memory_bytes(); available && cache_bytes > *available)
      throw cli::error(exit_status::bad_usage,
                       cache_option + ": a KV cache of " + plural(num_blocks, "block") + " of " +
                           plural(options.block_size, "token") + " takes " + format_byte_size(cache_bytes) +
                           (pools == 2 ? " with --preemption swap's host pool" : "") + ", more than the " +
                           format_byte_size(*available) + " of memory available");
    if (num_blocks > std::int64_t(max_int32))
      throw cli::error(exit_status::bad_usage, cache_option + ": " + plural(num_blocks, "block") + " are more than the " +
                                                   "engine addresses (2^31 - 1)");
    options.num_blocks = std::int32_t(num_blocks);
    // A request refused now rather than after others ran: its prompt alone, or with every token it
    // must generate (EOS ignored, no stop string), needs more blocks than the cache has.
    const bool runs_to_max_tokens = params.ignore_eos && params.stop.empty();
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const std::int64_t tokens = std::int64_t(prompt_ids[i].size()) + (runs_to_max_tokens ? params.max_tokens - 1 : 0);
      const std::int64_t blocks = (tokens + options.block_size - 1) / options.block_size;
      if (blocks > num_blocks)
        throw cli::error(exit_status::rejected,
                         prompts[i].source + ": the request cannot fit in the KV cache: its " +
                             plural(std::int64_t(prompt_ids[i].size()), "prompt token") +
                             (runs_to_max_tokens ? " and " + std::to_string(params.max_tokens - 1) +
                                                       " more it must hold to generate --max-tokens with --ignore-eos"
                                                 : "") +
                             " need " + plural(blocks, "block") + " of " + plural(options.block_size, "token") + "; " +
                             cache_option + " holds " + plural(num_blocks, "block"));
    }
    std::cerr << "[pagedkv-llama] load " << load_s << " s; KV cache " << options.num_blocks << " blocks of "
              << options.block_size << " tokens = " << std::int64_t(options.num_blocks) * options.block_size
              << " tokens, " << format_byte_size(std::uint64_t(options.num_blocks) * block_bytes) << " ("
              << block_bytes / std::size_t(options.block_size) << " bytes per token)\n";

    engine e(std::move(backend), tok ? &*tok : nullptr, options);
    if (bench) {
      workload.max_output_tokens = max_tokens_option->count() > 0 ? params.max_tokens : bench_default_max_tokens;
      workload.context_tokens = std::int32_t(std::min<std::int64_t>(config.context_length, 1 << 30));
      workload.vocab_size = std::int32_t(config.vocab_size);
      workload.seed = params.seed;
      const std::vector<bench_request> requests = make_bench_workload(workload);
      if (!workload_out.empty()) {
        std::ofstream json(workload_out);
        json << "[";
        for (std::size_t i = 0; i < requests.size(); ++i) {
          json << (i ? ",\n" : "\n") << "{\"output_tokens\": " << requests[i].output_tokens << ", \"prompt\": [";
          for (std::size_t j = 0; j < requests[i].prompt.size(); ++j) json << (j ? "," : "") << requests[i].prompt[j];
          json << "]}";
        }
        json << "\n]\n";
        if (!json.flush()) throw cli::error(exit_status::failure, "--bench-workload-out " + workload_out + ": cannot write");
      }
      std::cout << "pagedkv-llama --bench: " << workload.num_requests << " ShareGPT-like requests (seed " << workload.seed
                << ", lengths x" << workload.length_scale << ", prompts <= " << workload.max_prompt_tokens << " tokens, " << workload.shared_prefix_tokens
                << " shared; outputs <= " << workload.max_output_tokens << "), block size " << options.block_size
                << ", prefix caching " << (options.enable_prefix_caching ? "on" : "off") << ", preemption "
                << preemption_mode << ", async scheduling " << (options.async_scheduling ? "on" : "off") << "\n";
      const bench_result result = run_bench(e, requests, params, stderr);
      if (device == "cuda") {
        // Under tensor parallelism: rank 0's GPU, its shard's weights and KV heads.
        const bench_roofline roofline{.weight_bytes = bf16_weight_bytes_per_step(plan ? plan->shards[0].config : config),
                                      .kv_bytes_per_token = double(block_bytes) / options.block_size,
                                      .read_bytes_per_s = read_bytes_per_s,
                                      .gpu_busy_s = tensor_parallel ? tensor_parallel_stats_of(e.backend()).busy_seconds
                                                                    : cuda_busy_seconds(e.backend())};
        print_bench_result(std::cout, result, &roofline);
        const cuda_graph_stats graphs =
            tensor_parallel ? tensor_parallel_stats_of(e.backend()).graphs : cuda_graph_stats_of(e.backend());
        const char* mode = enforce_eager ? "off (--enforce-eager)"
                           : tensor_parallel && !tensor_parallel_timed_graphs
                               ? "on (their collectives untimed; --tensor-parallel-timed-graphs)"
                               : "on";
        std::cout << "CUDA graphs        " << mode << ": " << graphs.captures
                  << " captured in " << graphs.capture_seconds << " s, " << graphs.replays << " decode steps replayed of "
                  << result.num_steps << "\n";
        print_tensor_parallel_report(std::cout, e.backend());
        if (!tensor_parallel) {
          const cuda_step_stats steps = cuda_step_stats_of(e.backend());
          std::printf("prefill GPU/host   %.2f ms a step on the device (events), %.2f ms of host time to its last launch; "
                      "%lld of %lld enqueued while the step before ran; cuBLASLt heuristic %.3f s; buffer growths %lld; "
                      "attention splits capped in %lld steps\n",
                      steps.prefill_steps ? 1e3 * steps.prefill_gpu_seconds / double(steps.prefill_steps) : 0.0,
                      steps.prefill_steps ? 1e3 * steps.prefill_host_seconds / double(steps.prefill_steps) : 0.0,
                      static_cast<long long>(steps.prefill_enqueued_ahead), static_cast<long long>(steps.prefill_steps),
                      steps.heuristic_seconds, static_cast<long long>(steps.buffer_growths),
                      static_cast<long long>(steps.attention_split_caps));
          const auto choices = cuda_gemm_choices(e.backend());
          if (tune_gemms) {
            write_gemm_choices(tune_gemms_file, cuda_gemm_target(), choices);
            std::printf("GEMM tuning        %lld decode batches tuned in %.1f s (in the run's time): %zu products off "
                        "the heuristic's first choice, written to %s\n",
                        static_cast<long long>(steps.tuned_batches), steps.tuning_seconds, choices.size(),
                        tune_gemms_file.c_str());
          } else if (!tune_gemms_file.empty()) {
            // A choice whose shape never ran (another model's, or batch) or whose index the
            // heuristic's list does not reach is not among the backend's.
            const auto applied = std::count_if(gemm_choices.choices.begin(), gemm_choices.choices.end(), [&](const auto& c) {
              return std::find(choices.begin(), choices.end(), c) != choices.end();
            });
            std::printf("GEMM tuning        %zu products off the heuristic's first choice read from %s, %zu of them run "
                        "(the others' shapes did not, or have fewer candidates)\n",
                        gemm_choices.choices.size(), tune_gemms_file.c_str(), std::size_t(applied));
          }
          std::fflush(stdout);
        }
      } else {
        print_bench_result(std::cout, result);
      }
      return 0;
    }
    std::vector<pagedkv::request_id> ids;
    std::int64_t prompt_tokens = 0;
    for (std::vector<pagedkv::token_id>& p : prompt_ids) {
      prompt_tokens += std::int64_t(p.size());
      ids.push_back(e.add_request(std::move(p), params));
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
    std::vector<std::string> rejections;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const request_result& r = e.result(ids[i]);
      if (r.rejected) {
        std::size_t longest = 0;
        for (const completion& c : r.completions) longest = std::max(longest, c.tokens.size());
        rejections.push_back(prompts[i].source + ": rejected after " + plural(std::int64_t(longest), "generated token") +
                             ": the request outgrew the KV cache of " + plural(options.num_blocks, "block") + " of " +
                             plural(options.block_size, "token") + " (" + cache_option + ")");
      }
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
    for (const std::string& rejection : rejections) std::cerr << "pagedkv-llama: " << rejection << "\n";
    return int(rejections.empty() ? exit_status::success : exit_status::rejected);
  } catch (const cli::error& error) {
    std::cerr << "pagedkv-llama: " << error.what() << "\n";
    return int(error.status());
  } catch (const chat_template_error& error) {
    std::cerr << "pagedkv-llama: --chat: " << error.what() << "; --chat-template NAME picks one of "
              << "chatml, llama2, llama3, mistral\n";
    return int(exit_status::bad_usage);
  } catch (const std::exception& error) {
    std::cerr << "pagedkv-llama: " << error.what() << "\n";
    return int(exit_status::failure);
  }
}
