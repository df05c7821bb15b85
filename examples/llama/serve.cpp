#include "serve.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
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
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "chat_template.hpp"
#include "cli_checks.hpp"
#include "cuda/cuda_backend.hpp"
#include "engine.hpp"
#include "gguf.hpp"
#include "llama_config.hpp"
#include "llama_weights.hpp"
#include "model_backend.hpp"
#include "serve_api.hpp"
#include "serving_loop.hpp"
#include "tokenizer.hpp"

namespace pagedkv::llama {
namespace {

using namespace std::chrono_literals;

constexpr double max_int32 = 2147483647.0;
constexpr std::size_t max_body_bytes = 8u << 20;

/// JSON text that never throws: bytes that are not UTF-8 (a token's piece of a character) become U+FFFD.
std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, int status, const std::string& type, const std::string& message) {
  res.status = status;
  res.set_content(dump(api_error_body(type, message)) + "\n", "application/json");
}

template <std::size_t N>
void histogram_text(std::ostringstream& out, const char* name, const char* help, const latency_histogram<N>& h) {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  for (std::size_t i = 0; i < N; ++i) out << name << "_bucket{le=\"" << h.upper_bounds_s[i] << "\"} " << h.counts[i] << "\n";
  out << name << "_bucket{le=\"+Inf\"} " << h.count << "\n" << name << "_sum " << h.sum_s << "\n" << name << "_count " << h.count << "\n";
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
  histogram_text(out, "pagedkv_time_to_first_token_seconds", "From the request's arrival to its first token.", m.ttft);
  histogram_text(out, "pagedkv_time_per_output_token_seconds", "Between successive steps that sampled a request's tokens.",
                 m.tpot);
  return out.str();
}

int stop_pipe[2] = {-1, -1};

/// Debian's compiled cpp-httplib 0.11 listens with a backlog of 5 connections, and does not expose
/// its socket: 200 clients connecting at once saw about one in ten connections reset. Listening
/// again on a listening socket only changes its backlog (Linux), so find the socket by its port.
void widen_listen_backlog(int port) {
  for (int fd = 3; fd < 1024; ++fd) {
    int listening = 0;
    socklen_t length = sizeof listening;
    sockaddr_storage address{};
    socklen_t address_length = sizeof address;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 || !listening ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&address), &address_length) != 0)
      continue;
    const int bound = address.ss_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in&>(address).sin_port)
                      : address.ss_family == AF_INET6 ? ntohs(reinterpret_cast<const sockaddr_in6&>(address).sin6_port)
                                                     : -1;
    if (bound == port) ::listen(fd, SOMAXCONN);
  }
}

volatile std::sig_atomic_t stop_signalled = 0;

extern "C" void write_to_stop_pipe(int) {
  const char byte = 1;
  [[maybe_unused]] const ssize_t written = write(stop_pipe[1], &byte, 1);
}

extern "C" void signal_to_stop(int) {
  stop_signalled = 1;
  write_to_stop_pipe(0);
}

/// The seeds of requests that give none: one generator for the server, seeded once (--seed), so
/// that such requests draw apart, and a server started with the same --seed and sent the same
/// requests in the same order repeats its answers.
class request_seeds {
 public:
  explicit request_seeds(std::uint64_t seed) : generator_(seed) {}
  std::uint64_t next() {
    std::lock_guard lock(mutex_);
    return generator_();
  }

 private:
  std::mutex mutex_;
  std::mt19937_64 generator_;
};

/// Answers POST /v1/completions or /v1/chat/completions: the whole response, or server-sent events.
void handle_api_request(api kind, const httplib::Request& http_req, httplib::Response& res, const served_model& model,
                        serving_loop<engine>& loop, request_seeds& seeds, std::atomic<std::int64_t>& next_id,
                        std::atomic<std::int32_t>& open_streams) {
  try {
    api_request parsed = parse_api_request(kind, http_req.body, model);
    if (!parsed.seeded) parsed.params.seed = seeds.next();
    auto req = std::make_shared<const api_request>(std::move(parsed));
    std::shared_ptr<request_stream> stream = loop.submit(req->prompt, req->params);
    const bool chat = kind == api::chat;
    const json head = {{"id", (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++)},
                       {"object", chat ? "chat.completion" : "text_completion"},
                       {"created", std::time(nullptr)},
                       {"model", model.name}};
    if (!req->stream) {
      stream->wait();
      const std::optional<request_result> result = stream->result();
      if (!result) throw api_error(400, "invalid_request_error", stream->error());
      res.set_content(dump(api_response(*req, head, *result, model.tok)) + "\n", "application/json");
      return;
    }
    // Server-sent events: a chunk per piece of text (chat: a first one with each choice's role), one
    // with each choice's finish_reason, the usage when asked for, then [DONE]. With logprobs each
    // chunk carries those of the tokens it releases (the last one any EOS's). Beams are chosen at
    // the end, so their text comes whole then. A failed write means the client hung up: the
    // releaser cancels the request, and the engine thread frees its blocks.
    json event_head = head;
    if (chat) event_head["object"] = "chat.completion.chunk";
    res.set_header("Cache-Control", "no-cache");
    ++open_streams;
    res.set_chunked_content_provider(
        "text/event-stream",
        [req, stream, event_head, tok = model.tok, started = false,
         text_offsets = std::vector<std::size_t>(std::size_t(req->n))](std::size_t, httplib::DataSink& sink) mutable {
          const auto send = [&](const json& choices) {
            json event = event_head;
            event["choices"] = choices;
            const std::string line = "data: " + dump(event) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          if (!started && req->kind == api::chat) {
            for (std::int32_t i = 0; i < req->n; ++i)
              if (!send(json::array({{{"index", i}, {"delta", {{"role", "assistant"}, {"content", ""}}}, {"logprobs", nullptr},
                                      {"finish_reason", nullptr}}})))
                return false;
          }
          started = true;
          stream_chunk chunk;
          switch (stream->next(chunk, 50ms)) {
            case stream_status::timeout: return sink.is_writable();
            case stream_status::chunk:
              if (chunk.sample >= req->n) return true;  // never for n = best_of; beams stream nothing
              return send(json::array({stream_choice(
                  *req, chunk.sample, chunk.text, chunk.finished,
                  req->logprobs ? logprobs_json(*req, chunk.tokens, chunk.token_logprobs, chunk.top_logprobs, tok,
                                                text_offsets[std::size_t(chunk.sample)])
                                : json(nullptr))}));
            case stream_status::finished: break;
          }
          const std::optional<request_result> result = stream->result();
          if (!result) {
            const std::string line = "data: " + dump(api_error_body("invalid_request_error", stream->error())) + "\n\n";
            if (!sink.write(line.data(), line.size())) return false;
          } else {
            if (req->params.beam_width > 0) {
              const std::vector<const completion*> beams = returned_completions(*req, *result);
              for (std::size_t i = 0; i < beams.size(); ++i)
                if (!send(json::array({stream_choice(*req, std::int32_t(i), beams[i]->text, finish_reason::none,
                                                     req->logprobs ? completion_logprobs_json(*req, *beams[i], tok)
                                                                   : json(nullptr))})) ||
                    !send(json::array({stream_choice(*req, std::int32_t(i), {}, beams[i]->reason)})))
                  return false;
            }
            if (req->include_usage) {
              json event = event_head;
              event["choices"] = json::array();
              event["usage"] = usage_json(*req, *result);
              const std::string line = "data: " + dump(event) + "\n\n";
              if (!sink.write(line.data(), line.size())) return false;
            }
          }
          static constexpr std::string_view done = "data: [DONE]\n\n";
          if (!sink.write(done.data(), done.size())) return false;
          sink.done();
          return true;
        },
        [&loop, &open_streams, stream](bool success) {
          if (!success && !stream->finished()) loop.cancel(stream);
          --open_streams;
        });
  } catch (const api_error& e) {
    send_error(res, e.status(), e.type(), e.what());
  } catch (const queue_full& e) {
    send_error(res, 429, "rate_limit_error", e.what());
  } catch (const server_stopping& e) {
    send_error(res, 503, "service_unavailable", e.what());
  }
}

}  // namespace

int serve_main(int argc, char** argv) {
  CLI::App app{"pagedkv-llama serve: an OpenAI-compatible HTTP server over the engine"};
  app.name("pagedkv-llama serve");
  app.option_defaults()->always_capture_default();
  std::string model_path = PAGEDKV_DEFAULT_MODEL, host = "127.0.0.1", served_name, chat_template_name;
  std::int32_t port = 8000, kv_cache_tokens = 16384;
  double shutdown_timeout_s = 10.0;
  bool no_prefix_caching = false;
  std::optional<std::uint64_t> seed;
  std::string device = "cpu", model_shape;
  double gpu_memory_utilization = 0.9;
  bool enforce_eager = false;
  engine_options options;
  serving_loop_options loop_options;
  app.add_option("--model", model_path, "GGUF model file")->check(CLI::ExistingFile);
  app.add_option("--device", device, "Where the model runs")
      ->check(CLI::IsMember(std::vector<std::string>(model_backend_devices().begin(), model_backend_devices().end())));
  app.add_option("--model-shape", model_shape,
                 "Instead of --model, random bf16 weights of this shape made on the GPU (with --device cuda): "
                 "llama2-7b, llama3-8b, llama2-13b. Timing only: no tokenizer, so prompts are token ids, the text "
                 "is empty and no chat")
      ->check(CLI::IsMember({"llama2-7b", "llama3-8b", "llama2-13b"}))
      ->excludes("--model");
  CLI::Option* utilization_option =
      app.add_option("--gpu-memory-utilization", gpu_memory_utilization,
                     "With --device cuda and no --kv-cache-tokens: the fraction of the GPU's memory this process may "
                     "use; the KV cache takes what the weights leave of it")
          ->check(cli::number_in({0.01}, {1.0}));
  app.add_flag("--enforce-eager", enforce_eager, "With --device cuda: no CUDA graphs for decode steps");
  app.add_option("--served-model-name", served_name, "The model's name in /v1/models and requests (default: the file's stem)");
  app.add_option("--host", host, "Address to listen on");
  app.add_option("--port", port, "Port to listen on; 0: any free port (the one chosen is printed)")
      ->check(cli::number_in({0.0}, {65535.0}));
  app.add_option("--max-queued-requests", loop_options.max_queued_requests,
                 "Requests accepted and not finished; one more gets HTTP 429")
      ->check(cli::number_in({1.0}, {4096.0}));
  app.add_option("--shutdown-timeout", shutdown_timeout_s,
                 "Seconds SIGTERM/SIGINT lets requests in flight finish before aborting them")
      ->check(cli::number_in({0.0}, {3600.0}));
  app.add_option("--chat-template", chat_template_name,
                 "/v1/chat/completions' format instead of the file's template: chatml, llama2, llama3 or mistral")
      ->check(CLI::IsMember(std::vector<std::string>(chat_format_names.begin(), chat_format_names.end())));
  app.add_option("--block-size", options.block_size, "KV cache block size in tokens")->check(CLI::Range(1, 256));
  CLI::Option* tokens_option = app.add_option("--kv-cache-tokens", kv_cache_tokens, "KV cache capacity in tokens")
                                   ->check(cli::number_in({1.0}, {max_int32}));
  app.add_option("--max-batch-tokens", options.max_tokens_per_step, "Token budget of one step (chunks long prompts)")
      ->check(cli::number_in({1.0}, {max_int32}));
  app.add_option("--max-num-seqs", options.max_num_seqs, "Sequences one step may run")->check(cli::number_in({1.0}, {65536.0}));
  app.add_flag("--no-prefix-caching", no_prefix_caching, "Disable automatic prefix caching");
  app.add_option("--seed", seed,
                 "Seeds the generator that draws a seed for each request that gives none (default: the system's "
                 "entropy; the one taken is printed)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error) == 0 ? 0 : int(cli::exit_status::bad_usage);
  }

  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not the end
  try {
    if (!model_shape.empty() && device != "cuda")
      throw cli::error(cli::exit_status::bad_usage,
                       "--model-shape " + model_shape + ": random weights are made on the GPU: they need --device cuda");
    if (device != "cuda" && utilization_option->count() > 0)
      throw cli::error(cli::exit_status::bad_usage, "--gpu-memory-utilization needs --device cuda");
    if (device == "cuda")
      if (std::string why; !cuda_backend_available(&why)) throw cli::error(cli::exit_status::failure, "--device cuda: " + why);
    if (model_shape.empty() && !std::filesystem::exists(model_path))
      throw cli::error(cli::exit_status::failure, model_path + ": no such file (the default model is fetched by scripts/fetch-model.sh)");
    // --model-shape: no file, random weights made by the CUDA backend, no tokenizer.
    const std::optional<gguf_file> file = model_shape.empty() ? std::optional(gguf_file::open(model_path)) : std::nullopt;
    const llama_config config = file ? config_from_gguf(*file) : *named_model_shape(model_shape);
    const std::optional<tokenizer> tok = file ? std::optional(tokenizer::from_gguf(*file)) : std::nullopt;
    // The chat template: the file's, told by its markers, or --chat-template's. A model without one
    // still serves completions; its chat requests get 400 with the reason.
    std::optional<chat_template> chat;
    std::string chat_refusal;
    if (!tok) {
      chat_refusal = "--model-shape " + model_shape + " serves random weights without a tokenizer: send "
                     "/v1/completions a prompt of token ids";
    } else {
      try {
        chat = chat_template_name.empty()
                   ? chat_template::from_gguf(*file, *tok)
                   : chat_template::named(*chat_format_from_name(chat_template_name),
                                          tok->bos_id() >= 0 ? tok->token_text(tok->bos_id()) : std::string(),
                                          tok->eos_id() >= 0 ? tok->token_text(tok->eos_id()) : std::string());
      } catch (const chat_template_error& e) {
        chat_refusal = std::string(e.what()) + "; start the server with --chat-template NAME";
      }
    }
    const llama_weights weights = file ? load_llama_weights(*file, config) : llama_weights{};
    std::unique_ptr<model_backend> backend =
        file ? make_model_backend(config, weights, {.device = device, .enforce_eager = enforce_eager})
             : make_cuda_backend(config, nullptr, {.cuda_graphs = !enforce_eager});
    options.enable_prefix_caching = !no_prefix_caching;
    options.num_blocks = std::int32_t((std::int64_t(kv_cache_tokens) + options.block_size - 1) / options.block_size);
    // On the GPU, without --kv-cache-tokens, the cache takes what the weights leave of the memory share.
    if (device == "cuda" && tokens_option->count() == 0) {
      const std::uint64_t budget = cuda_kv_budget_bytes(*backend, gpu_memory_utilization);
      options.num_blocks = budget > 0 ? kv_blocks_for_bytes(*backend, options.block_size, budget) : 0;
      if (options.num_blocks < 1)
        throw cli::error(cli::exit_status::bad_usage, "--gpu-memory-utilization " + std::to_string(gpu_memory_utilization) +
                                                          " leaves no GPU memory for the KV cache once the weights are loaded");
    }
    engine e(std::move(backend), tok ? &*tok : nullptr, options);
    const std::string default_name = file ? std::filesystem::path(model_path).stem().string() : model_shape;
    const served_model model{.name = served_name.empty() ? default_name : served_name,
                             .tok = tok ? &*tok : nullptr,
                             .chat = chat ? &*chat : nullptr,
                             .chat_refusal = chat_refusal,
                             .context_tokens = config.context_length,
                             .vocab_size = config.vocab_size,
                             .block_size = options.block_size,
                             .num_blocks = options.num_blocks};

    serving_loop<engine> loop(e, loop_options);
    httplib::Server server;
    // A handler thread per streaming client, and a few more so that a full queue can still answer 429.
    const auto threads = std::size_t(loop_options.max_queued_requests) + 4;
    server.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
    const std::time_t started = std::time(nullptr);
    if (!seed) seed = (std::uint64_t(std::random_device{}()) << 32) | std::random_device{}();
    request_seeds seeds(*seed);
    std::atomic<std::int64_t> next_id = 0;
    std::atomic<std::int32_t> open_streams = 0;  // event streams not yet ended: SIGTERM lets them end

    // 503 once SIGTERM came, so that a load balancer stops sending before the server stops.
    server.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
      const bool stopping = loop.stopping();
      res.status = stopping ? 503 : 200;
      res.set_content(stopping ? "{\"status\": \"stopping\"}\n" : "{\"status\": \"ok\"}\n", "application/json");
    });
    server.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
      const json models = {{"object", "list"},
                           {"data", json::array({{{"id", model.name}, {"object", "model"}, {"created", started},
                                                  {"owned_by", "pagedkv"}, {"max_model_len", model.context_tokens}}})}};
      res.set_content(dump(models) + "\n", "application/json");
    });
    server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics_text(loop.metrics()), "text/plain; version=0.0.4");
    });
    server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
      handle_api_request(api::completions, req, res, model, loop, seeds, next_id, open_streams);
    });
    server.Post("/v1/chat/completions", [&](const httplib::Request& req, httplib::Response& res) {
      handle_api_request(api::chat, req, res, model, loop, seeds, next_id, open_streams);
    });
    // Wrong methods on known paths: 405 naming the right one, rather than httplib's 404.
    const auto wrong_method = [](const char* allowed) {
      return [allowed](const httplib::Request& req, httplib::Response& res) {
        res.set_header("Allow", allowed);
        send_error(res, 405, "invalid_request_error", req.method + " " + req.path + ": method not allowed; use " + allowed);
      };
    };
    for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
      server.Get(path, wrong_method("POST"));
      server.Put(path, wrong_method("POST"));
      server.Delete(path, wrong_method("POST"));
      server.Patch(path, wrong_method("POST"));
    }
    for (const char* path : {"/health", "/v1/models", "/metrics"}) {
      server.Post(path, wrong_method("GET"));
      server.Put(path, wrong_method("GET"));
      server.Delete(path, wrong_method("GET"));
      server.Patch(path, wrong_method("GET"));
    }
    // Bounds on what one client can hold: a body (a full context of token ids is under 1 MiB of
    // JSON), and the seconds a client may take to send its request or read a chunk.
    server.set_payload_max_length(max_body_bytes);
    server.set_read_timeout(5, 0);
    server.set_write_timeout(30, 0);
    // httplib's own refusals (unknown path, body too large, a request that is not HTTP) in
    // OpenAI's error shape too.
    server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string message = res.status == 404   ? req.method + " " + req.path + ": no such endpoint"
                                  : res.status == 413 ? "the body exceeds " + std::to_string(max_body_bytes) + " bytes"
                                                      : "bad HTTP request (status " + std::to_string(res.status) + ")";
      send_error(res, res.status, res.status == 404 ? "not_found_error" : "invalid_request_error", message);
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
    widen_listen_backlog(bound_port);
    // SIGINT and SIGTERM wake a thread that drains the loop and stops the server: the handler only
    // writes to a pipe, as a handler may do little else. (Blocking the signals instead would miss
    // OpenBLAS's threads, started before main, and one of them would take the signal's default action.)
    if (pipe(stop_pipe) != 0) throw cli::error(cli::exit_status::failure, "cannot make the signal pipe");
      std::thread signal_thread([&] {
      char byte = 0;
      while (read(stop_pipe[0], &byte, 1) < 0 && errno == EINTR) {
      }
      if (!stop_signalled) return;  // the server stopped by itself
      // New requests get 503 from now on; those in flight have the timeout to finish, then are
      // aborted, and their clients get what was generated, finish_reason "aborted".
      const auto timeout = std::chrono::milliseconds(std::int64_t(shutdown_timeout_s * 1000.0));
      const std::int32_t aborted = loop.drain(timeout);
      // Their streams' last events are written by the handler threads: give them a moment (a
      // client that stopped reading is cut off by the server's write timeout anyway).
      for (int wait = 0; wait < 500 && open_streams > 0; ++wait) std::this_thread::sleep_for(10ms);
      std::cerr << "[pagedkv-llama serve] stopping: " << aborted << " requests aborted after --shutdown-timeout "
                << shutdown_timeout_s << " s" << std::endl;
      server.stop();
    });
    // Installed for good: a second signal during the shutdown only writes to the pipe again.
    std::signal(SIGINT, signal_to_stop);
    std::signal(SIGTERM, signal_to_stop);
    std::cerr << "[pagedkv-llama serve] " << model.name << " on " << device << ": KV cache " << options.num_blocks << " blocks of "
              << options.block_size << " tokens; chat: " << (chat ? chat->describe() : "none (" + chat_refusal + ")")
              << "; request seeds from --seed " << *seed << "; listening on http://" << host << ":" << bound_port << std::endl;
    const bool listened = server.listen_after_bind();
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
