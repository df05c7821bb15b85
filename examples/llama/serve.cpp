#include "serve.hpp"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "cli_checks.hpp"
#include "engine.hpp"
#include "gguf.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "model_backend.hpp"
#include "serving_loop.hpp"
#include "tokenizer.hpp"

namespace pagedkv::llama {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

constexpr double max_int32 = 2147483647.0;

/// A request refused with this HTTP status; what() names the field and the problem.
struct http_error : std::runtime_error {
  http_error(int status, std::string type, const std::string& message)
      : std::runtime_error(message), status(status), type(std::move(type)) {}
  int status;
  std::string type;
};

http_error bad_request(const std::string& message) { return {400, "invalid_request_error", message}; }

void send_error(httplib::Response& res, int status, const std::string& type, const std::string& message) {
  res.status = status;
  res.set_content(json{{"error", {{"message", message}, {"type", type}}}}.dump() + "\n", "application/json");
}

/// What the server knows of its model, for checking a request before it is queued.
struct served_model {
  std::string name;
  const tokenizer* tok = nullptr;
  std::int64_t context_tokens = 0;
  std::int32_t block_size = 0;
  std::int32_t num_blocks = 0;
};

/// A number field checked by the CLI's own interval check (cli_checks.hpp), so that the server and
/// the command line refuse the same values with the same words: "top_p: 0 is not in (0, 1]".
double number_field(const json& body, const char* field, double fallback, cli::bound min, cli::bound max,
                    bool integer = false) {
  const auto it = body.find(field);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number() || (integer && !it->is_number_integer()))
    throw bad_request(std::string(field) + ": expected " + (integer ? "an integer" : "a number") + ", got " +
                      it->dump());
  std::string text = it->dump();
  if (const std::string why = cli::number_in(min, max)(text); !why.empty())
    throw bad_request(std::string(field) + ": " + why);
  return it->get<double>();
}

struct completion_request {
  std::vector<token_id> prompt;
  sampling_params params;
  bool stream = false;
  bool include_usage = false;
};

completion_request parse_completion_request(const std::string& body_text, const served_model& model) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    throw bad_request(std::string("the body is not JSON: ") + e.what());
  }
  if (!body.is_object()) throw bad_request("the body must be a JSON object");
  if (const auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) throw bad_request("model: expected a string, got " + it->dump());
    if (it->get<std::string>() != model.name)
      throw http_error(404, "not_found_error", "model: '" + it->get<std::string>() + "' is not served; this server serves '" +
                                                   model.name + "'");
  }
  const auto prompt = body.find("prompt");
  if (prompt == body.end() || !prompt->is_string())
    throw bad_request(prompt == body.end() ? "prompt: missing (a string)"
                                           : "prompt: expected a string (arrays are not supported yet), got " +
                                                 prompt->dump().substr(0, 80));
  for (const char* unsupported : {"logprobs", "echo", "suffix", "best_of", "use_beam_search"})
    if (const auto it = body.find(unsupported);
        it != body.end() && !it->is_null() && *it != false && *it != 0 && !(*it == 1 && std::string_view(unsupported) == "best_of"))
      throw bad_request(std::string(unsupported) + ": not supported yet");
  completion_request r;
  sampling_params& p = r.params;
  p.max_tokens = std::int32_t(number_field(body, "max_tokens", 16, {1.0}, {double(1 << 20)}, true));
  p.temperature = float(number_field(body, "temperature", 1.0, {0.0}, {100.0}));
  p.top_p = float(number_field(body, "top_p", 1.0, {0.0, false}, {1.0}));
  const double top_k = number_field(body, "top_k", 0, {-1.0}, {max_int32}, true);
  p.top_k = top_k < 0 ? 0 : std::int32_t(top_k);  // vLLM's -1: all tokens
  number_field(body, "seed", 0, {0.0}, {0x1p64}, true);
  if (const auto it = body.find("seed"); it != body.end() && it->is_number_unsigned()) p.seed = it->get<std::uint64_t>();
  p.n = std::int32_t(number_field(body, "n", 1, {1.0}, {64.0}, true));
  if (const auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (it->is_array() || it->is_string()) {
      for (const json& s : it->is_array() ? *it : json::array({*it})) {
        if (!s.is_string() || s.get<std::string>().empty())
          throw bad_request("stop: expected non-empty strings, got " + s.dump());
        p.stop.push_back(s.get<std::string>());
      }
    } else {
      throw bad_request("stop: expected a string or an array of strings, got " + it->dump());
    }
  }
  for (const char* flag : {"stream", "ignore_eos"})
    if (const auto it = body.find(flag); it != body.end() && !it->is_null() && !it->is_boolean())
      throw bad_request(std::string(flag) + ": expected true or false, got " + it->dump());
  r.stream = body.value("stream", false);
  p.ignore_eos = body.value("ignore_eos", false);
  if (const auto it = body.find("stream_options"); it != body.end() && it->is_object())
    r.include_usage = it->value("include_usage", false);

  const std::string& text = prompt->get_ref<const std::string&>();
  const std::vector<token_id> text_ids = model.tok->encode(text);
  if (text_ids.empty()) throw bad_request("prompt: encodes to no token of the model's vocabulary");
  if (model.tok->add_bos()) r.prompt.push_back(model.tok->bos_id());
  r.prompt.insert(r.prompt.end(), text_ids.begin(), text_ids.end());
  const auto length = std::int64_t(r.prompt.size());
  if (length + p.max_tokens > model.context_tokens)
    throw bad_request("max_tokens: " + std::to_string(length) + " prompt tokens and max_tokens " +
                      std::to_string(p.max_tokens) + " exceed the model's context of " +
                      std::to_string(model.context_tokens) + " tokens");
  const std::int64_t blocks = (length + model.block_size - 1) / model.block_size;
  if (blocks > model.num_blocks)
    throw bad_request("prompt: its " + std::to_string(length) + " tokens need " + std::to_string(blocks) +
                      " KV blocks of " + std::to_string(model.block_size) + " tokens; the cache holds " +
                      std::to_string(model.num_blocks) + " (--kv-cache-tokens)");
  return r;
}

/// OpenAI's finish_reason: "stop" for EOS or a stop string, "length"; else the engine's own word.
json openai_finish_reason(finish_reason reason) {
  switch (reason) {
    case finish_reason::none: return nullptr;
    case finish_reason::eos:
    case finish_reason::stop_string: return "stop";
    case finish_reason::length: return "length";
    default: return std::string(to_string(reason));
  }
}

json usage_of(const completion_request& req, const request_result& result) {
  std::int64_t generated = 0;
  for (const completion& c : result.completions) generated += std::int64_t(c.tokens.size());
  const auto prompt = std::int64_t(req.prompt.size());
  return {{"prompt_tokens", prompt}, {"completion_tokens", generated}, {"total_tokens", prompt + generated}};
}

std::string metrics_text(const serving_metrics& m) {
  std::ostringstream out;
  const auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    out << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << value << "\n";
  };
  metric("pagedkv_requests_running", "gauge", "Requests the engine runs, swapped-out ones included.", m.num_running);
  metric("pagedkv_requests_waiting", "gauge", "Requests accepted and not yet running.", m.num_waiting);
  metric("pagedkv_requests_finished_total", "counter", "Requests finished, aborted ones included.", m.num_finished);
  metric("pagedkv_requests_aborted_total", "counter", "Requests aborted: a client hung up, or the server stopped.",
         m.num_aborted);
  metric("pagedkv_preemptions_total", "counter", "Preemptions of running requests.", m.num_preemptions);
  metric("pagedkv_kv_blocks_total", "gauge", "Blocks of the device KV pool.", m.kv.num_blocks);
  metric("pagedkv_kv_blocks_used", "gauge", "KV blocks referenced by a live sequence.", m.kv.num_used_blocks);
  metric("pagedkv_kv_usage_ratio", "gauge", "Used KV blocks over all blocks.",
         m.kv.num_blocks > 0 ? double(m.kv.num_used_blocks) / m.kv.num_blocks : 0.0);
  metric("pagedkv_prefix_cache_hit_rate", "gauge", "Prompt tokens served from the prefix cache over prompt tokens.",
         m.kv.prefix_hit_rate);
  return out.str();
}

int stop_pipe[2] = {-1, -1};

extern "C" void write_to_stop_pipe(int) {
  const char byte = 1;
  [[maybe_unused]] const ssize_t written = write(stop_pipe[1], &byte, 1);
}

}  // namespace

int serve_main(int argc, char** argv) {
  CLI::App app{"pagedkv-llama serve: an OpenAI-compatible HTTP server over the engine"};
  app.name("pagedkv-llama serve");
  app.option_defaults()->always_capture_default();
  std::string model_path = PAGEDKV_DEFAULT_MODEL, host = "127.0.0.1", served_name;
  std::int32_t port = 8000, kv_cache_tokens = 16384;
  bool no_prefix_caching = false;
  engine_options options;
  serving_loop_options loop_options;
  app.add_option("--model", model_path, "GGUF model file")->check(CLI::ExistingFile);
  app.add_option("--served-model-name", served_name, "The model's name in /v1/models and requests (default: the file's stem)");
  app.add_option("--host", host, "Address to listen on");
  app.add_option("--port", port, "Port to listen on; 0: any free port (the one chosen is printed)")
      ->check(cli::number_in({0.0}, {65535.0}));
  app.add_option("--max-queued-requests", loop_options.max_queued_requests,
                 "Requests accepted and not finished; one more gets HTTP 429")
      ->check(cli::number_in({1.0}, {4096.0}));
  app.add_option("--block-size", options.block_size, "KV cache block size in tokens")->check(CLI::Range(1, 256));
  app.add_option("--kv-cache-tokens", kv_cache_tokens, "KV cache capacity in tokens")->check(cli::number_in({1.0}, {max_int32}));
  app.add_option("--max-batch-tokens", options.max_tokens_per_step, "Token budget of one step (chunks long prompts)")
      ->check(cli::number_in({1.0}, {max_int32}));
  app.add_option("--max-num-seqs", options.max_num_seqs, "Sequences one step may run")->check(cli::number_in({1.0}, {65536.0}));
  app.add_flag("--no-prefix-caching", no_prefix_caching, "Disable automatic prefix caching");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : int(cli::exit_status::bad_usage);
  }

  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not the end
  try {
    if (!std::filesystem::exists(model_path))
      throw cli::error(cli::exit_status::failure, model_path + ": no such file (the default model is fetched by scripts/fetch-model.sh)");
    const gguf_file file = gguf_file::open(model_path);
    const llama_config config = config_from_gguf(file);
    const tokenizer tok = tokenizer::from_gguf(file);
    const llama_weights weights = load_llama_weights(file, config);
    options.enable_prefix_caching = !no_prefix_caching;
    options.num_blocks = std::int32_t((std::int64_t(kv_cache_tokens) + options.block_size - 1) / options.block_size);
    engine e(make_model_backend(config, weights, {.device = "cpu"}), &tok, options);
    const served_model model{.name = served_name.empty() ? std::filesystem::path(model_path).stem().string() : served_name,
                             .tok = &tok,
                             .context_tokens = config.context_length,
                             .block_size = options.block_size,
                             .num_blocks = options.num_blocks};

    serving_loop<engine> loop(e, loop_options);
    httplib::Server server;
    // A handler thread per streaming client, and a few more so that a full queue can still answer 429.
    const auto threads = std::size_t(loop_options.max_queued_requests) + 4;
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    const std::time_t started = std::time(nullptr);
    std::atomic<std::int64_t> next_id = 0;

    server.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\": \"ok\"}\n", "application/json");
    });
    server.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
      const json models = {{"object", "list"},
                           {"data", json::array({{{"id", model.name}, {"object", "model"}, {"created", started},
                                                  {"owned_by", "pagedkv"}, {"max_model_len", model.context_tokens}}})}};
      res.set_content(models.dump() + "\n", "application/json");
    });
    server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(loop.metrics()), "text/plain; version=0.0.4");
    });
    server.Post("/v1/completions", [&](const httplib::Request& http_req, httplib::Response& res) {
      try {
        auto req = std::make_shared<completion_request>(parse_completion_request(http_req.body, model));
        std::shared_ptr<request_stream> stream = loop.submit(req->prompt, req->params);
        const json head = {{"id", "cmpl-" + std::to_string(next_id++)}, {"object", "text_completion"},
                           {"created", std::time(nullptr)}, {"model", model.name}};
        if (!req->stream) {
          stream->wait();
          const std::optional<request_result> result = stream->result();
          if (!result) throw bad_request(stream->error());
          json body = head;
          body["choices"] = json::array();
          for (std::size_t i = 0; i < result->completions.size(); ++i)
            body["choices"].push_back({{"index", i}, {"text", result->completions[i].text}, {"logprobs", nullptr},
                                       {"finish_reason", openai_finish_reason(result->completions[i].reason)}});
          body["usage"] = usage_of(*req, *result);
          res.set_content(body.dump() + "\n", "application/json");
          return;
        }
        // Server-sent events: a chunk per piece of text, one with each sample's finish_reason, the
        // usage when asked for, then [DONE]. A failed write means the client hung up: the releaser
        // cancels the request, and the engine thread frees its blocks.
        res.set_header("Cache-Control", "no-cache");
        res.set_chunked_content_provider(
            "text/event-stream",
            [req, stream, head](std::size_t, httplib::DataSink& sink) {
              const auto send = [&](const json& event) {
                const std::string line = "data: " + event.dump() + "\n\n";
                return sink.write(line.data(), line.size());
              };
              stream_chunk chunk;
              switch (stream->next(chunk, 50ms)) {
                case stream_status::timeout: return sink.is_writable();
                case stream_status::chunk: {
                  json event = head;
                  event["choices"] = json::array({{{"index", chunk.sample}, {"text", chunk.text}, {"logprobs", nullptr},
                                                   {"finish_reason", openai_finish_reason(chunk.finished)}}});
                  return send(event);
                }
                case stream_status::finished: break;
              }
              const std::optional<request_result> result = stream->result();
              if (!result) {
                if (!send(json{{"error", {{"message", stream->error()}, {"type", "invalid_request_error"}}}})) return false;
              } else if (req->include_usage) {
                json event = head;
                event["choices"] = json::array();
                event["usage"] = usage_of(*req, *result);
                if (!send(event)) return false;
              }
              static constexpr std::string_view done = "data: [DONE]\n\n";
              if (!sink.write(done.data(), done.size())) return false;
              sink.done();
              return true;
            },
            [&loop, stream](bool success) {
              if (!success && !stream->finished()) loop.cancel(stream);
            });
      } catch (const http_error& e) {
        send_error(res, e.status, e.type, e.what());
      } catch (const queue_full& e) {
        send_error(res, 429, "rate_limit_error", e.what());
      }
    });
    server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string message = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        message = e.what();
      } catch (...) {
      }
      send_error(res, 500, "server_error", message);
    });

    const int bound_port = port == 0 ? server.bind_to_any_port(host) : (server.bind_to_port(host, port) ? port : -1);
    if (bound_port < 0)
      throw cli::error(cli::exit_status::failure, "cannot listen on " + host + ":" + std::to_string(port));
    // SIGINT and SIGTERM wake a thread that stops the server: the handler only writes to a pipe,
    // as a handler may do little else. (Blocking the signals instead would miss OpenBLAS's threads,
    // started before main, and one of them would take the signal's default action.)
    if (pipe(stop_pipe) != 0) throw cli::error(cli::exit_status::failure, "cannot make the signal pipe");
    std::thread signal_thread([&] {
      char byte = 0;
      while (read(stop_pipe[0], &byte, 1) < 0 && errno == EINTR) {
      }
      server.stop();
    });
    std::signal(SIGINT, write_to_stop_pipe);
    std::signal(SIGTERM, write_to_stop_pipe);
    std::cerr << "[pagedkv-llama serve] " << model.name << ": KV cache " << options.num_blocks << " blocks of "
              << options.block_size << " tokens; listening on http://" << host << ":" << bound_port << std::endl;
    const bool listened = server.listen_after_bind();
    std::signal(SIGINT, SIG_DFL);
    std::signal(SIGTERM, SIG_DFL);
    write_to_stop_pipe(0);  // ends the signal thread where no signal came
    signal_thread.join();
    if (!listened) throw cli::error(cli::exit_status::failure, "the server stopped listening on an error");
    std::cerr << "[pagedkv-llama serve] stopped: " << loop.metrics().num_finished << " requests finished\n";
    return 0;
  } catch (const cli::error& error) {
    std::cerr << "pagedkv-llama serve: " << error.what() << "\n";
    return int(error.status());
  } catch (const std::exception& error) {
    std::cerr << "pagedkv-llama serve: " << error.what() << "\n";
    return int(cli::exit_status::failure);
  }
}

}  // namespace pagedkv::llama
