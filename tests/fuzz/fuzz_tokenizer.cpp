// libFuzzer target for the tokenizers. The first byte picks what the rest is:
//   0: text for the byte-level BPE tokenizer (tests/runner/golden/tiny_bpe.tokenizer.json);
//      decode(encode(text)) must give the text back exactly, with special tokens parsed or not,
//      and so must the pieces of a stream_decoder;
//   1: text for the SentencePiece BPE tokenizer (tiny_spm.tokenizer.json); encode and decode;
//   2: a tokenizer.json to load, then encode a fixed string with it.
// Anything but success or load_error (a crash, a sanitizer report, a failed round trip) is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "load_error.hpp"
#include "tokenizer.hpp"

namespace {

const pagedkv::llama::tokenizer& golden_tokenizer(const char* name) {
  // The golden directory is baked in at build time; PAGEDKV_GOLDEN_DIR in the environment overrides it.
  const char* dir = std::getenv("PAGEDKV_GOLDEN_DIR");
  static const std::string base = dir ? dir : PAGEDKV_GOLDEN_DIR;
  static const auto bpe = pagedkv::llama::tokenizer::from_tokenizer_json_file(base + "/tiny_bpe.tokenizer.json");
  static const auto spm = pagedkv::llama::tokenizer::from_tokenizer_json_file(base + "/tiny_spm.tokenizer.json");
  return std::string_view(name) == "bpe" ? bpe : spm;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace pagedkv::llama;
  if (size == 0) return 0;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Texts past 1 KB find nothing new and only slow the sanitized BPE down.
  const std::string_view text = input.substr(0, 1024);
  switch (data[0] % 3) {
    case 0: {
      const auto& tok = golden_tokenizer("bpe");
      for (const auto specials : {special_tokens::parse, special_tokens::as_text})
        if (tok.decode(tok.encode(text, specials)) != text) std::abort();
      // Streamed one token at a time, the pieces must add up to the same text.
      stream_decoder stream(tok);
      std::string streamed;
      for (const auto id : tok.encode(text)) streamed += stream.push(id);
      if (streamed + stream.finish() != text) std::abort();
      break;
    }
    case 1: {
      const auto& tok = golden_tokenizer("spm");
      (void)tok.decode(tok.encode(text));
      (void)tok.decode(tok.encode(text, special_tokens::as_text));
      break;
    }
    case 2:
      try {
        const auto tok = tokenizer::from_tokenizer_json(input, "fuzz.json");
        (void)tok.decode(tok.encode("Hello <s> w\xC3\xB6rld 123 \xF0\x9F\x99\x82  !<|im_end|>"));
      } catch (const load_error&) {
      }
      break;
  }
  return 0;
}
