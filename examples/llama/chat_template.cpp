#include "chat_template.hpp"

#include <algorithm>

#include "gguf.hpp"

namespace pagedkv::llama {
namespace {

constexpr std::string_view alternate_roles = "Conversation roles must alternate user/assistant/user/assistant/...";

/// Whether `text` begins (or ends) with a character Python's str.isspace() accepts, and its length:
/// Jinja's trim and Python's strip() remove these, the Unicode spaces included.
std::size_t space_at(std::string_view text, bool at_end) {
  static constexpr std::array<std::string_view, 29> spaces = {
      " ", "\t", "\n", "\v", "\f", "\r", "\x1c", "\x1d", "\x1e", "\x1f", "\u0085", "\u00a0", "\u1680", "\u2000", "\u2001",
      "\u2002", "\u2003", "\u2004", "\u2005", "\u2006", "\u2007", "\u2008", "\u2009", "\u200a", "\u2028", "\u2029",
      "\u202f", "\u205f", "\u3000"};
  for (const std::string_view space : spaces)
    if (at_end ? text.ends_with(space) : text.starts_with(space)) return space.size();
  return 0;
}

/// Python's str.strip() on UTF-8 text.
std::string strip(std::string_view text) {
  while (const std::size_t n = space_at(text, false)) text.remove_prefix(n);
  while (const std::size_t n = space_at(text, true)) text.remove_suffix(n);
  return std::string(text);
}

/// A Jinja string literal's text with its escapes (\n, \t, \\, \', \") resolved.
std::string unescape(std::string_view literal) {
  std::string text;
  for (std::size_t i = 0; i < literal.size(); ++i) {
    if (literal[i] != '\\' || i + 1 == literal.size()) {
      text += literal[i];
      continue;
    }
    const char next = literal[++i];
    text += next == 'n' ? '\n' : next == 't' ? '\t' : next;
  }
  return text;
}

/// The default system message of a ChatML template: the constant text after "<|im_start|>system"
/// and a newline (written as one or as the escape \n), up to "<|im_end|>" in the same string
/// literal. Empty when the template writes none.
std::string default_system_prompt_of(std::string_view source) {
  constexpr std::string_view open = "<|im_start|>system", close = "<|im_end|>";
  for (std::size_t at = source.find(open); at != std::string_view::npos; at = source.find(open, at + 1)) {
    std::size_t start = at + open.size();
    if (source.substr(start).starts_with("\n")) start += 1;
    else if (source.substr(start).starts_with("\\n")) start += 2;
    else continue;
    const std::size_t end = source.find(close, start);
    if (end == std::string_view::npos) continue;
    const std::string_view literal = source.substr(start, end - start);
    if (literal.find_first_of("'\"{}+") != std::string_view::npos) continue;  // built from variables
    return unescape(literal);
  }
  return {};
}

/// The start of a template for a message, on one line: "{{ bos_token }}{% for message in messages..."
std::string quote_start(std::string_view source) {
  constexpr std::size_t shown = 72;
  std::string text;
  for (const char c : source.substr(0, shown)) text += c == '\n' ? std::string("\\n") : std::string(1, c);
  return "\"" + text + (source.size() > shown ? "...\"" : "\"");
}

std::string render_llama2(const chat_template& t, std::span<const chat_message> messages) {
  std::string text;
  std::optional<std::string> system;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    messages = messages.subspan(1);
  }
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const chat_message& m = messages[i];
    if ((m.role == "user") != (i % 2 == 0)) throw chat_template_error(std::string(alternate_roles));
    // Appended piece by piece: GCC 12 warns (-Wrestrict, wrongly) on chains of std::string +.
    std::string content;
    if (i == 0 && system) ((content += "<<SYS>>\n") += *system) += "\n<</SYS>>\n\n";
    content += m.content;
    if (m.role == "user") (((text += t.bos_token) += "[INST] ") += strip(content)) += " [/INST]";
    else if (m.role == "assistant") (((text += " ") += strip(content)) += " ") += t.eos_token;
  }
  return text;
}

std::string render_llama3(const chat_template& t, std::span<const chat_message> messages, bool add_generation_prompt) {
  std::string text;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    if (i == 0) text += t.bos_token;
    ((((text += "<|start_header_id|>") += messages[i].role) += "<|end_header_id|>\n\n") += strip(messages[i].content)) +=
        "<|eot_id|>";
  }
  if (add_generation_prompt || t.always_opens_assistant) text += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return text;
}

std::string render_mistral(const chat_template& t, std::span<const chat_message> messages) {
  std::string text = t.bos_token;
  for (std::size_t i = 0; i < messages.size(); ++i) {
    const chat_message& m = messages[i];
    if ((m.role == "user") != (i % 2 == 0)) throw chat_template_error(std::string(alternate_roles));
    if (m.role == "user") ((text += "[INST] ") += m.content) += " [/INST]";
    else if (m.role == "assistant") ((text += m.content) += t.eos_token) += t.space_after_reply ? " " : "";
    else throw chat_template_error("Only user and assistant roles are supported!");
  }
  return text;
}

}  // namespace

std::string_view to_string(chat_format format) noexcept { return chat_format_names[std::size_t(format)]; }

std::optional<chat_format> chat_format_from_name(std::string_view name) noexcept {
  const auto it = std::find(chat_format_names.begin(), chat_format_names.end(), name);
  if (it == chat_format_names.end()) return std::nullopt;
  return chat_format(it - chat_format_names.begin());
}

chat_template chat_template::named(chat_format format, std::string bos_token, std::string eos_token) {
  return {.format = format, .bos_token = std::move(bos_token), .eos_token = std::move(eos_token)};
}

chat_template chat_template::detect(std::string_view source, std::string bos_token, std::string eos_token) {
  std::optional<chat_format> format;
  if (source.find("<|im_start|>") != std::string_view::npos) format = chat_format::chatml;
  else if (source.find("<|start_header_id|>") != std::string_view::npos) format = chat_format::llama3;
  else if (source.find("[INST]") != std::string_view::npos)
    format = source.find("<<SYS>>") != std::string_view::npos ? chat_format::llama2 : chat_format::mistral;
  if (!format)
    throw chat_template_error("a template of none of the formats --chat renders (chatml: <|im_start|>; llama2: [INST] "
                              "and <<SYS>>; llama3: <|start_header_id|>; mistral: [INST]): " + quote_start(source));
  // Llama 3.1's tools and "Today Date" header, Qwen 2.5's and Mistral v0.3's tool calls: their
  // plain chats differ from the released formats' (a date header, a system message moved).
  for (const std::string_view feature : {"tools", "tool_call", "date_string", "strftime_now"})
    if (source.find(feature) != std::string_view::npos)
      throw chat_template_error("a " + std::string(to_string(*format)) + " template that also renders " +
                                (feature.starts_with("tool") ? "tool calls" : "dates") + " ('" + std::string(feature) +
                                "'), which --chat does not reproduce: " + quote_start(source));
  chat_template t = named(*format, std::move(bos_token), std::move(eos_token));
  if (t.format == chat_format::chatml) t.default_system_prompt = default_system_prompt_of(source);
  if (t.format == chat_format::llama3) t.always_opens_assistant = source.find("add_generation_prompt") == std::string_view::npos;
  if (t.format == chat_format::mistral)
    t.space_after_reply = source.find("eos_token + ' '") != std::string_view::npos ||
                          source.find("eos_token + \" \"") != std::string_view::npos;
  return t;
}

chat_template chat_template::from_gguf(const gguf_file& file, const tokenizer& tok) {
  const std::optional<std::string> source = file.try_get_string("tokenizer.chat_template");
  if (!source) throw chat_template_error(file.file_name() + ": no tokenizer.chat_template in the file");
  const auto text_of = [&](token_id id) { return id >= 0 ? tok.token_text(id) : std::string(); };
  try {
    return detect(*source, text_of(tok.bos_id()), text_of(tok.eos_id()));
  } catch (const chat_template_error& error) {
    throw chat_template_error(file.file_name() + ": tokenizer.chat_template: " + error.what());
  }
}

std::string chat_template::render(std::span<const chat_message> messages, bool add_generation_prompt) const {
  switch (format) {
    case chat_format::chatml: return format_chatml(messages, add_generation_prompt, default_system_prompt);
    case chat_format::llama2: return render_llama2(*this, messages);
    case chat_format::llama3: return render_llama3(*this, messages, add_generation_prompt);
    case chat_format::mistral: return render_mistral(*this, messages);
  }
  return {};
}

std::string chat_template::describe() const {
  std::string text(to_string(format));
  if (!default_system_prompt.empty()) text += " with a default system prompt";
  if (space_after_reply) text += " (v0.1)";
  if (always_opens_assistant) text += " (always opens the assistant turn)";
  return text;
}

}  // namespace pagedkv::llama
