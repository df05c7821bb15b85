// Chat templates (examples/llama/chat_template.hpp) against transformers' apply_chat_template on
// the templates the models ship (tests/runner/golden/chat_templates.json, written by
// tools/make_chat_template_golden.py): each template is recognized as its format, and every
// conversation renders to the same text, or is refused with the same message.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_template.hpp"
#include "gguf.hpp"
#include "gguf_writer.hpp"

namespace pagedkv::llama {
namespace {

const nlohmann::json& golden() {
  static const nlohmann::json g = [] {
    std::ifstream in(std::string(PAGEDKV_GOLDEN_DIR) + "/chat_templates.json");
    if (!in) throw std::runtime_error("missing tests/runner/golden/chat_templates.json");
    return nlohmann::json::parse(in);
  }();
  return g;
}

chat_template detected(const std::string& name) {
  const nlohmann::json& t = golden().at("templates").at(name);
  return chat_template::detect(t.at("source").get<std::string>(), t.at("bos_token"), t.at("eos_token"));
}

std::vector<chat_message> messages_of(const nlohmann::json& c) {
  std::vector<chat_message> messages;
  for (const auto& m : c.at("messages")) messages.push_back({m.at("role"), m.at("content")});
  return messages;
}

/// The text render() gives, or "error: <message>" where it refuses.
std::string rendered(const chat_template& t, const nlohmann::json& c) {
  try {
    return t.render(messages_of(c), c.at("add_generation_prompt").get<bool>());
  } catch (const chat_template_error& e) {
    return std::string("error: ") + e.what();
  }
}

std::string expected(const nlohmann::json& c) {
  return c.contains("error") ? "error: " + c.at("error").get<std::string>() : c.at("text").get<std::string>();
}

TEST(chat_template, each_shipped_template_is_recognized_as_its_format) {
  ASSERT_EQ(golden().at("templates").size(), 7u);
  std::map<chat_format, int> formats;
  for (const auto& [name, t] : golden().at("templates").items()) {
    const chat_template ct = detected(name);
    EXPECT_EQ(to_string(ct.format), t.at("kind").get<std::string>()) << name;
    ++formats[ct.format];
  }
  EXPECT_EQ(formats.size(), 4u);  // every format has a template
  EXPECT_EQ(detected("smollm2").default_system_prompt, smollm2_default_system_prompt);
  EXPECT_EQ(detected("chatml").default_system_prompt, "");
  EXPECT_TRUE(detected("mistral_v01").space_after_reply);
  EXPECT_FALSE(detected("mistral_v02").space_after_reply);
  EXPECT_TRUE(detected("llama3_always").always_opens_assistant);
  EXPECT_FALSE(detected("llama3").always_opens_assistant);
}

TEST(chat_template, renders_what_apply_chat_template_renders) {
  std::map<std::string, int> texts, errors;
  for (const auto& c : golden().at("cases")) {
    const std::string name = c.at("template");
    SCOPED_TRACE(name + ": " + c.at("messages").dump() + (c.at("add_generation_prompt").get<bool>() ? " +gen" : ""));
    EXPECT_EQ(rendered(detected(name), c), expected(c));
    ++(c.contains("error") ? errors : texts)[name];
  }
  // Every template rendered chats, and the alternating ones refused some.
  for (const auto& [name, t] : golden().at("templates").items()) EXPECT_GE(texts[name], 6) << name;
  for (const std::string name : {"llama2", "mistral_v01", "mistral_v02"}) EXPECT_GE(errors[name], 2) << name;
}

// --chat-template NAME: the plain form of each format renders as its released template does.
TEST(chat_template, a_named_format_renders_as_its_released_template) {
  const std::map<std::string, chat_format> released = {
      {"chatml", chat_format::chatml}, {"llama2", chat_format::llama2}, {"llama3", chat_format::llama3},
      {"mistral_v02", chat_format::mistral}};
  int compared = 0;
  for (const auto& c : golden().at("cases")) {
    const auto it = released.find(c.at("template").get<std::string>());
    if (it == released.end()) continue;
    const nlohmann::json& t = golden().at("templates").at(it->first);
    EXPECT_EQ(rendered(chat_template::named(it->second, t.at("bos_token"), t.at("eos_token")), c), expected(c));
    ++compared;
  }
  EXPECT_EQ(compared, 4 * 20);
  for (const std::string_view name : chat_format_names) EXPECT_EQ(to_string(*chat_format_from_name(name)), name);
  EXPECT_FALSE(chat_format_from_name("gemma"));
}

std::string refusal(std::string_view source) {
  try {
    (void)chat_template::detect(source, "<s>", "</s>");
  } catch (const chat_template_error& e) {
    return e.what();
  }
  return "accepted";
}

TEST(chat_template, an_unknown_template_or_one_with_tools_is_refused_by_name) {
  // google/gemma-7b-it's: none of the four formats' markers.
  const std::string gemma =
      "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}{% for message in messages %}{{ '<start_of_turn>' + role + '\\n' }}{% endfor %}";
  EXPECT_EQ(refusal(gemma),
            "a template of none of the formats --chat renders (chatml: <|im_start|>; llama2: [INST] and <<SYS>>; "
            "llama3: <|start_header_id|>; mistral: [INST]): \"{{ bos_token }}{% if messages[0]['role'] == 'system' %}"
            "{{ raise_exceptio...\"");
  // The head of Llama 3.1's: a date header and tools.
  EXPECT_EQ(refusal("{{- bos_token }}\n{%- if not date_string is defined %}{%- set date_string = \"26 Jul 2024\" %}"
                    "{%- endif %}{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}"),
            "a llama3 template that also renders dates ('date_string'), which --chat does not reproduce: \"{{- "
            "bos_token }}\\n{%- if not date_string is defined %}{%- set date_string...\"");
  EXPECT_EQ(refusal("{%- if tools %}<|im_start|>system\n{%- endif %}").substr(0, 60),
            "a chatml template that also renders tool calls ('tools'), wh");
  EXPECT_EQ(refusal(""), "a template of none of the formats --chat renders (chatml: <|im_start|>; llama2: [INST] and "
                         "<<SYS>>; llama3: <|start_header_id|>; mistral: [INST]): \"\"");
}

// From a file: the template in tokenizer.chat_template with the tokenizer's BOS and EOS text, and a
// refusal naming the file when the template is missing or unknown.
TEST(chat_template, from_a_gguf_with_the_tokenizers_bos_and_eos) {
  const tokenizer tok({.model = tokenizer_model::sentencepiece_bpe, .tokens = {"<unk>", "<s>", "</s>", "a"},
                       .kinds = {token_kind::unknown, token_kind::control, token_kind::control, token_kind::normal},
                       .scores = {0.0f, 0.0f, 0.0f, 0.0f}, .merges = {},
                       .bos_id = 1, .eos_id = 2, .unknown_id = 0},
                      "tiny");
  const auto file_with = [](const std::optional<std::string>& source) {
    testing::gguf_writer w;
    w.header(0, source ? 1 : 0);
    if (source) w.kv_string("tokenizer.chat_template", *source);
    return gguf_file::parse(w.bytes, "tiny.gguf");
  };
  const nlohmann::json& llama2 = golden().at("templates").at("llama2");
  const chat_template t = chat_template::from_gguf(file_with(llama2.at("source").get<std::string>()), tok);
  EXPECT_EQ(t.format, chat_format::llama2);
  const std::vector<chat_message> chat = {{"user", "U"}, {"assistant", "A"}, {"user", "V"}};
  EXPECT_EQ(t.render(chat), "<s>[INST] U [/INST] A </s><s>[INST] V [/INST]");

  const auto refusal_of = [&](const std::optional<std::string>& source) -> std::string {
    try {
      (void)chat_template::from_gguf(file_with(source), tok);
    } catch (const chat_template_error& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(refusal_of(std::nullopt), "tiny.gguf: no tokenizer.chat_template in the file");
  EXPECT_EQ(refusal_of("{{ '<start_of_turn>' }}"),
            "tiny.gguf: tokenizer.chat_template: a template of none of the formats --chat renders (chatml: "
            "<|im_start|>; llama2: [INST] and <<SYS>>; llama3: <|start_header_id|>; mistral: [INST]): "
            "\"{{ '<start_of_turn>' }}\"");
}

}  // namespace
}  // namespace pagedkv::llama
