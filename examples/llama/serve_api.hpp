// The OpenAI API of `pagedkv-llama serve`, apart from the server: a request body checked and turned
// into the engine's prompt and sampling_params, and a result turned into the response's JSON. Every
// refusal is an api_error whose message starts with the field it names ("top_p: 0 is not in (0, 1]").
//
//   const api_request req = parse_api_request(api::chat, body_text, model);  // throws api_error
//   ... loop.submit(req.prompt, req.params) ... wait ...
//   respond(api_response(req, head, result).dump());
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "chat_template.hpp"
#include "engine_types.hpp"
#include "sampling_params.hpp"
#include "tokenizer.hpp"

namespace pagedkv::llama {

using json = nlohmann::json;

/// A request refused with this HTTP status; what() names the field and the problem.
class api_error : public std::runtime_error {
 public:
  api_error(int status, std::string type, const std::string& message)
      : std::runtime_error(message), status_(status), type_(std::move(type)) {}
  [[nodiscard]] int status() const noexcept { return status_; }
  [[nodiscard]] const std::string& type() const noexcept { return type_; }

 private:
  int status_;
  std::string type_;
};

/// The error body OpenAI's clients read: {"error": {"message": ..., "type": ...}}.
json api_error_body(const std::string& type, const std::string& message);

/// What the server knows of its model, for checking a request before it is queued.
struct served_model {
  std::string name;
  const tokenizer* tok = nullptr;       ///< null: random weights (--model-shape): token-id prompts only
  const chat_template* chat = nullptr;  ///< null: the model has no template render() reproduces
  std::string chat_refusal{};           ///< why there is none, for /v1/chat/completions' 400
  std::int64_t context_tokens = 0;
  std::int64_t vocab_size = 0;
  std::int32_t block_size = 0;
  std::int32_t num_blocks = 0;
};

enum class api { completions, chat };

struct api_request {
  api kind = api::completions;
  std::vector<token_id> prompt;  ///< BOS included where the model's tokenizer or template adds it
  /// What the engine runs: n is best_of's samples, beam_width use_beam_search's beams.
  sampling_params params;
  std::int32_t n = 1;            ///< choices returned: the first n, or the n most likely of best_of
  /// The body gave a seed (params.seed); else the server draws one (serve.cpp's request_seeds), so
  /// that two requests without one do not share their draws.
  bool seeded = false;
  bool stream = false;
  bool include_usage = false;    ///< stream_options.include_usage: a last event with the usage
  /// Completions' logprobs k, or chat's top_logprobs k when logprobs is true: each token's
  /// log-probability and its k most likely alternatives. nullopt: "logprobs": null.
  std::optional<std::int32_t> logprobs;
};

/// Parses and checks a body of POST /v1/completions or /v1/chat/completions against the model.
/// Throws api_error: 400 for bad JSON, a field of the wrong type, a value out of range or not
/// supported, a prompt the context or the KV cache can never hold; 404 for another model.
api_request parse_api_request(api kind, const std::string& body_text, const served_model& model);

/// OpenAI's finish_reason: "stop" for EOS or a stop string, "length"; else the engine's own word.
json finish_reason_json(finish_reason reason);

/// The completions a request returns: the first n, or with best_of the n of highest mean
/// log-probability per token (OpenAI's "best"), in that order.
std::vector<const completion*> returned_completions(const api_request& req, const request_result& result);

/// prompt_tokens, completion_tokens (every generated token, best_of's and EOS included) and total_tokens.
json usage_json(const api_request& req, const request_result& result);

/// The whole response: `head` (id, object, created, model) with choices and usage.
json api_response(const api_request& req, json head, const request_result& result, const tokenizer* tok);

/// The logprobs of some of a completion's tokens in the request's shape: completions' {tokens,
/// token_logprobs, top_logprobs, text_offset} (offsets from text_offset on, which moves past their
/// pieces), chat's {content: [{token, logprob, bytes, top_logprobs}]}. A stream sends each chunk's
/// tokens; together they are the whole response's. Without a tokenizer a token reads "token_id:N".
json logprobs_json(const api_request& req, std::span<const token_id> tokens, std::span<const double> token_logprobs,
                   std::span<const std::vector<token_logprob>> top_logprobs, const tokenizer* tok,
                   std::size_t& text_offset);

/// logprobs_json of a whole completion.
json completion_logprobs_json(const api_request& req, const completion& c, const tokenizer* tok);

/// One streamed choice of new text (`finished` none) or its end, with its tokens' logprobs_json
/// (null unless the request asks for logprobs).
json stream_choice(const api_request& req, std::int32_t index, const std::string& text, finish_reason finished,
                   json logprobs = nullptr);

}  // namespace pagedkv::llama
