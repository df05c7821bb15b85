#include "serve_api.hpp"

#include <algorithm>
#include <numeric>
#include <span>
#include <string_view>

#include "cli_checks.hpp"

namespace pagedkv::llama {
namespace {

constexpr double max_int32 = 2147483647.0;
constexpr std::int32_t max_samples = 64;   // n, best_of and beams: the CLI's --n and --beam-width limit
constexpr std::int32_t max_logprobs = 20;  // vLLM's default max_logprobs, OpenAI's top_logprobs limit

api_error bad_request(const std::string& message) { return {400, "invalid_request_error", message}; }

/// A number field checked by the CLI's own interval check (cli_checks.hpp), so that the server and
/// the command line refuse the same values with the same words: "top_p: 0 is not in (0, 1]".
std::optional<double> number_field(const json& body, const char* field, cli::bound min, cli::bound max,
                                   bool integer = false) {
  const auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (!it->is_number() || (integer && !it->is_number_integer()))
    throw bad_request(std::string(field) + ": expected " + (integer ? "an integer" : "a number") + ", got " +
                      it->dump().substr(0, 80));
  std::string text = it->dump();
  if (const std::string why = cli::number_in(min, max)(text); !why.empty())
    throw bad_request(std::string(field) + ": " + why);
  return it->get<double>();
}

bool bool_field(const json& body, const char* field, bool fallback) {
  const auto it = body.find(field);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) throw bad_request(std::string(field) + ": expected true or false, got " + it->dump().substr(0, 80));
  return it->get<bool>();
}

/// Fields of OpenAI's or vLLM's API that change the output in ways the engine does not do: refused
/// by name unless they hold their neutral value, so that no client gets a silently different answer.
void refuse_unsupported(const json& body) {
  const auto set = [&](const char* field) {
    const auto it = body.find(field);
    return it != body.end() && !it->is_null() ? &*it : nullptr;
  };
  for (const char* field : {"presence_penalty", "frequency_penalty"})
    if (const json* v = set(field); v && !(v->is_number() && v->get<double>() == 0.0))
      throw bad_request(std::string(field) + ": not supported (only 0)");
  for (const char* field : {"repetition_penalty", "length_penalty"})
    if (const json* v = set(field); v && !(v->is_number() && v->get<double>() == 1.0))
      throw bad_request(std::string(field) + ": not supported (only 1: beams are ranked by log-probability per token)");
  if (const json* v = set("echo"); v && *v != false) throw bad_request("echo: not supported");
  if (const json* v = set("suffix"); v && *v != "") throw bad_request("suffix: not supported");
  for (const char* field : {"logit_bias", "tools", "functions", "tool_choice", "function_call"})
    if (const json* v = set(field); v && !v->empty() && *v != "none") throw bad_request(std::string(field) + ": not supported");
  if (const json* v = set("response_format"); v && !(v->is_object() && v->value("type", "") == "text"))
    throw bad_request("response_format: only {\"type\": \"text\"} is supported");
}

/// Completions' prompt: a string, or the token ids themselves.
std::vector<token_id> completion_prompt(const json& body, const served_model& model) {
  const auto prompt = body.find("prompt");
  if (prompt == body.end() || prompt->is_null()) throw bad_request("prompt: missing (a string or an array of token ids)");
  std::vector<token_id> ids;
  if (prompt->is_string()) {
    if (!model.tok) throw bad_request("prompt: this server has no tokenizer (--model-shape): send token ids");
    const std::vector<token_id> text_ids = model.tok->encode(prompt->get_ref<const std::string&>());
    if (text_ids.empty()) throw bad_request("prompt: encodes to no token of the model's vocabulary");
    if (model.tok->add_bos()) ids.push_back(model.tok->bos_id());
    ids.insert(ids.end(), text_ids.begin(), text_ids.end());
    return ids;
  }
  if (prompt->is_array() && !prompt->empty() && std::all_of(prompt->begin(), prompt->end(), [](const json& t) { return t.is_number_integer(); })) {
    const std::int64_t vocab = model.vocab_size;
    for (std::size_t i = 0; i < prompt->size(); ++i) {
      const auto id = (*prompt)[i].get<std::int64_t>();
      if (id < 0 || id >= vocab)
        throw bad_request("prompt: token " + std::to_string(i) + " is " + std::to_string(id) + ", outside the vocabulary of " +
                          std::to_string(vocab));
      ids.push_back(token_id(id));
    }
    return ids;
  }
  if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_string())
    throw bad_request("prompt: one prompt a request (an array of prompts is not supported)");
  throw bad_request("prompt: expected a string or an array of token ids, got " + prompt->dump().substr(0, 80));
}

/// Chat's messages through the model's template, BOS as the template writes it.
std::vector<token_id> chat_prompt(const json& body, const served_model& model) {
  const auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array() || messages->empty())
    throw bad_request("messages: expected a non-empty array of {\"role\", \"content\"} objects");
  if (!model.chat) throw bad_request("messages: " + model.chat_refusal);
  std::vector<chat_message> chat;
  for (std::size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) throw bad_request(where + ": expected an object, got " + m.dump().substr(0, 80));
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) throw bad_request(where + ".role: expected a string");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";  // OpenAI's newer name for the system role
    if (r != "system" && r != "user" && r != "assistant")
      throw bad_request(where + ".role: '" + r.substr(0, 40) + "' is not one of system, developer, user, assistant");
    std::string content;
    const auto c = m.find("content");
    if (c != m.end() && c->is_string()) {
      content = c->get<std::string>();
    } else if (c != m.end() && c->is_array()) {  // content parts: text only
      for (std::size_t j = 0; j < c->size(); ++j) {
        const json& part = (*c)[j];
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") || !part["text"].is_string())
          throw bad_request(where + ".content[" + std::to_string(j) + "]: only {\"type\": \"text\", \"text\": ...} parts are supported");
        content += part["text"].get<std::string>();
      }
    } else if (!(r == "assistant" && (c == m.end() || c->is_null()))) {
      throw bad_request(where + ".content: expected a string or an array of text parts");
    }
    chat.push_back({std::move(r), std::move(content)});
  }
  std::string text;
  try {
    text = model.chat->render(chat);
  } catch (const chat_template_error& e) {
    throw bad_request(std::string("messages: ") + e.what());
  }
  std::vector<token_id> ids = model.tok->encode(text);
  if (ids.empty()) throw bad_request("messages: render to no token of the model's vocabulary");
  return ids;
}

/// A token's text, or vLLM's "token_id:N" where the server has no tokenizer (--model-shape).
std::string token_string(const tokenizer* tok, token_id id) {
  return tok ? tok->token_to_piece(id) : "token_id:" + std::to_string(id);
}

json bytes_of(const std::string& s) {
  json bytes = json::array();
  for (const char c : s) bytes.push_back(int(static_cast<unsigned char>(c)));
  return bytes;
}

}  // namespace

json logprobs_json(const api_request& req, std::span<const token_id> tokens, std::span<const double> token_logprobs,
                   std::span<const std::vector<token_logprob>> top_logprobs, const tokenizer* tok,
                   std::size_t& text_offset) {
  if (req.kind == api::completions) {
    // OpenAI's completions logprobs: tokens, token_logprobs, top_logprobs and text_offset (from the
    // start of the completion's text), one entry a generated token.
    json pieces = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::string piece = token_string(tok, tokens[i]);
      pieces.push_back(piece);
      lps.push_back(token_logprobs[i]);
      json top = json::object();
      if (i < top_logprobs.size())
        for (const token_logprob& alt : top_logprobs[i]) top[token_string(tok, alt.token)] = alt.logprob;
      tops.push_back(std::move(top));
      offsets.push_back(text_offset);
      text_offset += piece.size();
    }
    return {{"tokens", pieces}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }
  // OpenAI's chat logprobs: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}.
  json content = json::array();
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string piece = token_string(tok, tokens[i]);
    json top = json::array();
    if (i < top_logprobs.size())
      for (const token_logprob& alt : top_logprobs[i]) {
        const std::string alt_piece = token_string(tok, alt.token);
        top.push_back({{"token", alt_piece}, {"logprob", alt.logprob}, {"bytes", bytes_of(alt_piece)}});
      }
    content.push_back({{"token", piece}, {"logprob", token_logprobs[i]}, {"bytes", bytes_of(piece)}, {"top_logprobs", top}});
    text_offset += piece.size();
  }
  return {{"content", content}, {"refusal", nullptr}};
}

json completion_logprobs_json(const api_request& req, const completion& c, const tokenizer* tok) {
  std::size_t text_offset = 0;
  return logprobs_json(req, c.tokens, c.token_logprobs, c.top_logprobs, tok, text_offset);
}

json api_error_body(const std::string& type, const std::string& message) {
  return {{"error", {{"message", message}, {"type", type}}}};
}

api_request parse_api_request(api kind, const std::string& body_text, const served_model& model) {
  json body;
  try {
    body = json::parse(body_text);
  } catch (const json::parse_error& e) {
    throw bad_request(std::string("the body is not JSON: ") + e.what());
  }
  if (!body.is_object()) throw bad_request("the body must be a JSON object");
  if (const auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) throw bad_request("model: expected a string, got " + it->dump().substr(0, 80));
    if (it->get<std::string>() != model.name)
      throw api_error(404, "not_found_error", "model: '" + it->get<std::string>().substr(0, 80) +
                                                  "' is not served; this server serves '" + model.name + "'");
  }
  refuse_unsupported(body);

  api_request r;
  r.kind = kind;
  sampling_params& p = r.params;
  p.max_tokens = 16;
  for (const char* field : {"max_tokens", "max_completion_tokens"})  // chat's newer name
    if (const auto v = number_field(body, field, {1.0}, {double(1 << 20)}, true)) p.max_tokens = std::int32_t(*v);
  p.temperature = float(number_field(body, "temperature", {0.0}, {100.0}).value_or(1.0));
  p.top_p = float(number_field(body, "top_p", {0.0, false}, {1.0}).value_or(1.0));
  const double top_k = number_field(body, "top_k", {-1.0}, {max_int32}, true).value_or(0);
  p.top_k = top_k < 0 ? 0 : std::int32_t(top_k);  // vLLM's -1: all tokens
  if (number_field(body, "seed", {0.0}, {0x1p64}, true)) {
    p.seed = body["seed"].get<std::uint64_t>();
    r.seeded = true;
  }
  r.n = std::int32_t(number_field(body, "n", {1.0}, {double(max_samples)}, true).value_or(1));
  const auto best_of = number_field(body, "best_of", {1.0}, {double(max_samples)}, true);
  if (best_of && *best_of < r.n)
    throw bad_request("best_of: " + std::to_string(std::int32_t(*best_of)) + " is less than n " + std::to_string(r.n));
  // vLLM's beam extension: use_beam_search with best_of beams (n when absent), the n best returned.
  if (bool_field(body, "use_beam_search", false))
    p.beam_width = std::int32_t(best_of.value_or(r.n));
  else
    p.n = std::int32_t(best_of.value_or(r.n));
  if (const auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    if (!it->is_array() && !it->is_string()) throw bad_request("stop: expected a string or an array of strings, got " + it->dump().substr(0, 80));
    for (const json& s : it->is_array() ? *it : json::array({*it})) {
      if (!s.is_string() || s.get<std::string>().empty()) throw bad_request("stop: expected non-empty strings, got " + s.dump().substr(0, 80));
      p.stop.push_back(s.get<std::string>());
    }
    if (!p.stop.empty() && !model.tok) throw bad_request("stop: needs a tokenizer; this server has none (--model-shape)");
  }
  p.ignore_eos = bool_field(body, "ignore_eos", false);
  r.stream = bool_field(body, "stream", false);
  if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) throw bad_request("stream_options: expected an object, got " + it->dump().substr(0, 80));
    r.include_usage = bool_field(*it, "include_usage", false);
  }
  if (kind == api::completions) {
    if (const auto k = number_field(body, "logprobs", {0.0}, {double(max_logprobs)}, true)) r.logprobs = std::int32_t(*k);
  } else {
    const auto k = number_field(body, "top_logprobs", {0.0}, {double(max_logprobs)}, true);
    if (bool_field(body, "logprobs", false)) r.logprobs = std::int32_t(k.value_or(0));
    else if (k && *k > 0) throw bad_request("top_logprobs: needs \"logprobs\": true");
  }
  if (r.logprobs) p.top_logprobs = *r.logprobs;
  if (r.stream && p.beam_width == 0 && p.n > r.n) throw bad_request("best_of: cannot be streamed when greater than n");

  r.prompt = kind == api::chat ? chat_prompt(body, model) : completion_prompt(body, model);
  const auto length = std::int64_t(r.prompt.size());
  if (length >= model.context_tokens)
    throw bad_request((kind == api::chat ? "messages: " : "prompt: ") + std::to_string(length) +
                      " tokens leave no room in the model's context of " + std::to_string(model.context_tokens) + " tokens");
  if (kind == api::chat && !body.contains("max_tokens") && !body.contains("max_completion_tokens"))
    p.max_tokens = std::int32_t(model.context_tokens - length);  // OpenAI's chat default: what the context leaves
  if (length + p.max_tokens > model.context_tokens)
    throw bad_request("max_tokens: " + std::to_string(length) + " prompt tokens and max_tokens " + std::to_string(p.max_tokens) +
                      " exceed the model's context of " + std::to_string(model.context_tokens) + " tokens");
  const std::int64_t blocks = (length + model.block_size - 1) / model.block_size;
  if (blocks > model.num_blocks)
    throw bad_request((kind == api::chat ? "messages: its " : "prompt: its ") + std::to_string(length) + " tokens need " +
                      std::to_string(blocks) + " KV blocks of " + std::to_string(model.block_size) + " tokens; the cache holds " +
                      std::to_string(model.num_blocks) + " (--kv-cache-tokens)");
  return r;
}

json finish_reason_json(finish_reason reason) {
  switch (reason) {
    case finish_reason::none: return nullptr;
    case finish_reason::eos:
    case finish_reason::stop_string: return "stop";
    case finish_reason::length: return "length";
    default: return std::string(to_string(reason));
  }
}

std::vector<const completion*> returned_completions(const api_request& req, const request_result& result) {
  std::vector<const completion*> out;
  for (const completion& c : result.completions) out.push_back(&c);
  if (req.params.beam_width == 0 && req.params.n > req.n) {
    const auto mean = [](const completion* c) { return c->logprob / double(std::max<std::size_t>(1, c->tokens.size())); };
    std::stable_sort(out.begin(), out.end(), [&](const completion* a, const completion* b) { return mean(a) > mean(b); });
  }
  if (out.size() > std::size_t(req.n)) out.resize(std::size_t(req.n));  // beams come best first
  return out;
}

json usage_json(const api_request& req, const request_result& result) {
  std::int64_t generated = 0;
  for (const completion& c : result.completions) generated += std::int64_t(c.tokens.size());
  const auto prompt = std::int64_t(req.prompt.size());
  return {{"prompt_tokens", prompt}, {"completion_tokens", generated}, {"total_tokens", prompt + generated}};
}

json api_response(const api_request& req, json head, const request_result& result, const tokenizer* tok) {
  head["choices"] = json::array();
  const std::vector<const completion*> chosen = returned_completions(req, result);
  for (std::size_t i = 0; i < chosen.size(); ++i) {
    const completion& c = *chosen[i];
    json choice = {{"index", i}};
    if (req.kind == api::chat)
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else
      choice["text"] = c.text;
    choice["logprobs"] = req.logprobs ? completion_logprobs_json(req, c, tok) : json(nullptr);
    choice["finish_reason"] = finish_reason_json(c.reason);
    head["choices"].push_back(std::move(choice));
  }
  head["usage"] = usage_json(req, result);
  return head;
}

json stream_choice(const api_request& req, std::int32_t index, const std::string& text, finish_reason finished,
                   json logprobs) {
  json choice = {{"index", index}};
  if (req.kind == api::chat)
    choice["delta"] = finished == finish_reason::none ? json{{"content", text}} : json::object();
  else
    choice["text"] = text;
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_reason_json(finished);
  return choice;
}

}  // namespace pagedkv::llama
