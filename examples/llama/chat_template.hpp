// Chat templates: the text a chat model was trained to see around each message. A GGUF carries its
// model's template as Jinja source in tokenizer.chat_template; this runner does not run Jinja, it
// recognizes the four LLaMA-family formats by their markers and renders them in C++:
//
//   chatml   <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
//            (SmolLM2, Qwen, OpenHermes), with the default system prompt the template adds to a
//            chat that has none (SmolLM2's "You are a helpful AI assistant named SmolLM, ...")
//   llama2   <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ...
//   llama3   <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> ...
//   mistral  <s>[INST] {user} [/INST]{assistant}</s>[INST] ...  (v0.1 and v0.2; no system role)
//
// render() gives what transformers' apply_chat_template gives for the templates the models ship
// (tests/runner/golden/chat_templates.json, made by tools/make_chat_template_golden.py), refusals
// included: Llama-2 and Mistral require alternating user/assistant turns. A template with markers
// of none of these, or with features render() does not reproduce (tools, dates), is refused by
// name; --chat-template NAME picks one of the four by hand.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

#include "tokenizer.hpp"

namespace pagedkv::llama {

class gguf_file;

enum class chat_format { chatml, llama2, llama3, mistral };

inline constexpr std::array<std::string_view, 4> chat_format_names = {"chatml", "llama2", "llama3", "mistral"};
std::string_view to_string(chat_format format) noexcept;
/// The format called `name` (one of chat_format_names); nullopt for any other name.
std::optional<chat_format> chat_format_from_name(std::string_view name) noexcept;

/// A template that cannot be recognized, or a chat that the template refuses to render.
class chat_template_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct chat_template {
  chat_format format = chat_format::chatml;
  std::string bos_token{};            ///< the text of the tokenizer's BOS: llama2, llama3 and mistral write it
  std::string eos_token{};            ///< ends an assistant turn of llama2 and mistral
  std::string default_system_prompt{};  ///< chatml: the system message of a chat that starts without one
  bool space_after_reply = false;     ///< mistral v0.1: a space after each reply's EOS
  bool always_opens_assistant = false;  ///< llama3's first release: the assistant header even without add_generation_prompt

  /// The plain form of a format: ChatML without a default system prompt, Llama-3 and Mistral v0.2 as
  /// released.
  static chat_template named(chat_format format, std::string bos_token, std::string eos_token);
  /// Recognizes Jinja source by its markers. Throws chat_template_error naming what it found when
  /// it is none of the four formats, or uses tools or dates, which render() does not reproduce.
  static chat_template detect(std::string_view source, std::string bos_token, std::string eos_token);
  /// detect() on the file's tokenizer.chat_template with the tokenizer's BOS and EOS text. Throws
  /// chat_template_error naming the file when it has none or it is not recognized.
  static chat_template from_gguf(const gguf_file& file, const tokenizer& tok);

  /// The prompt text of `messages`, ending with the opened assistant turn when
  /// add_generation_prompt is set (Llama-2 and Mistral have no such turn: the reply follows
  /// [/INST]). Throws chat_template_error with the template's own message where it refuses the
  /// chat: Llama-2 and Mistral need user and assistant turns alternating from a user turn (after
  /// one system message, for Llama-2; Mistral has no system role).
  [[nodiscard]] std::string render(std::span<const chat_message> messages, bool add_generation_prompt = true) const;
  /// "chatml with a default system prompt", "mistral (v0.1)": for the log line.
  [[nodiscard]] std::string describe() const;
};

}  // namespace pagedkv::llama
