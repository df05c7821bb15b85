// `pagedkv-llama serve`: an OpenAI-compatible HTTP server over the engine (cpp-httplib).
//   pagedkv-llama serve --port 8000
//   curl -s localhost:8000/v1/completions -d '{"prompt": "Once upon a time", "max_tokens": 16}'
// GET /health, GET /v1/models, POST /v1/completions (streamed as server-sent events with
// "stream": true), GET /metrics (Prometheus text). One engine thread runs the steps
// (serving_loop.hpp); the HTTP threads hand requests to it and read their streams.
#pragma once

namespace pagedkv::llama {

/// Runs the server until SIGINT or SIGTERM; argv[0] is "serve". Returns the exit status: 0 after a
/// signal, 2 for a refused option, 1 when the model cannot load or the port cannot be bound.
int serve_main(int argc, char** argv);

}  // namespace pagedkv::llama
