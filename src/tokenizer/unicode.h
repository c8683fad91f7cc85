// UTF-8 helpers shared by the tokenizer pieces: validation, code point iteration,
// lossy decoding that matches Rust's String::from_utf8_lossy (what HF `tokenizers`
// uses when decoding byte-level tokens), the GPT-2 byte<->unicode map and the
// character classes of Rust's `char` methods that HF pre-tokenizers rely on.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace moeserve::tok {

// Returns the byte offset of the first invalid UTF-8 sequence, or npos when valid.
size_t find_invalid_utf8(std::string_view s);

// Decodes the code point starting at s[i] (s must be valid UTF-8); advances i.
inline char32_t next_cp(std::string_view s, size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  if (b < 0x80) { ++i; return b; }
  if (b < 0xE0) { char32_t c = ((b & 0x1F) << 6) | (s[i + 1] & 0x3F); i += 2; return c; }
  if (b < 0xF0) {
    char32_t c = ((b & 0x0F) << 12) | ((s[i + 1] & 0x3F) << 6) | (s[i + 2] & 0x3F);
    i += 3;
    return c;
  }
  char32_t c = ((b & 0x07) << 18) | ((s[i + 1] & 0x3F) << 12) | ((s[i + 2] & 0x3F) << 6) | (s[i + 3] & 0x3F);
  i += 4;
  return c;
}
// Code point ending just before s[i] (valid UTF-8); moves i back.
char32_t prev_cp(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t c);
inline size_t utf8_len_of_lead(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

// Rust from_utf8_lossy: each maximal invalid subpart becomes one U+FFFD.
std::string utf8_lossy(std::string_view bytes);
// True when the text ends with U+FFFD (the replacement of an incomplete tail).
bool ends_with_replacement(std::string_view s);

// GPT-2 byte-level map: byte -> code point, and the reverse (-1 when not a mapped char).
const std::array<char32_t, 256>& byte_to_cp();
int cp_to_byte(char32_t c);
// The UTF-8 string of each mapped byte (1 or 2 bytes each).
const std::array<std::string, 256>& byte_to_utf8();

// Rust char::is_whitespace (White_Space property).
bool is_white_space(char32_t c);
// Rust char::is_numeric (general categories Nd, Nl, No).
bool is_numeric(char32_t c);
// HF `is_punc`: ASCII punctuation or general category P* (of the tables HF uses; bert_tables.inc).
bool is_punctuation(char32_t c);
// Rust regex \w: alphabetic, marks, decimal digits, connector punctuation.
bool is_word_char(char32_t c);
// Combining marks (M*) as HF StripAccents sees them (its tables; bert_tables.inc).
bool is_mark(char32_t c);
// BertNormalizer's character classes, from the (pre-Unicode-9) tables HF uses: "other"
// (Cc, Cf, Co) and non-spacing marks (Mn). See bert_tables.inc.
bool is_bert_other(char32_t c);
bool is_nonspacing_mark(char32_t c);
// Script class of HF's UnicodeScripts pre-tokenizer (Hiragana/Katakana/U+30FC count as Han),
// -1 for "Any" (' ' and characters HF's table does not know). See scripts_table.inc.
int script_class(char32_t c);

}  // namespace moeserve::tok
