// Pre-tokenizers: how text is cut into words before BPE runs inside each word.
#pragma once

#include <string_view>
#include <vector>

namespace pagedkv::llama {

/// Splits `text` as the GPT-2 regex does,
///   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
/// written out by hand (no regex engine): each alternative in order at each position, greedy, with
/// the one look-ahead resolved by giving the last whitespace of a run to the word after it.
/// Invalid UTF-8 bytes count as "other" (neither space, letter nor number). The pieces are views
/// into `text` and concatenate back to it.
std::vector<std::string_view> split_gpt2(std::string_view text);

/// Isolates every numeric character (category N) as its own piece, as Hugging Face's
/// Digits(individual_digits=true) pre-tokenizer does; the pieces concatenate back to `text`.
std::vector<std::string_view> split_digits(std::string_view text);

}  // namespace pagedkv::llama
