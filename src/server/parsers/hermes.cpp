// Hermes tool-call parser (vLLM `hermes`); semantics in qwen3.h.
//
// The call object is read a byte at a time by CallReader, a JSON reader that follows Python's
// json.loads (strict strings, NaN / Infinity accepted, surrogate pairs joined) and writes the
// "arguments" value as Python's json.dumps(ensure_ascii=False) writes it, as soon as each
// piece is decided. So streamed fragments concatenate to the non-streaming arguments text.
#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "server/parsers/qwen3.h"

namespace moeserve::server {

namespace {
constexpr std::string_view kCallStart = "<tool_call>";
constexpr std::string_view kCallEnd = "</tool_call>";

bool json_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// One code point inside a string literal, as json.dumps(ensure_ascii=False) writes it. A lone
// surrogate (Python keeps it in the str) is written as its escape, so the text stays UTF-8.
void append_py_char(std::string& out, uint32_t cp) {
  static const char* hex = "0123456789abcdef";
  switch (cp) {
    case '"': out += "\\\""; return;
    case '\\': out += "\\\\"; return;
    case '\n': out += "\\n"; return;
    case '\r': out += "\\r"; return;
    case '\t': out += "\\t"; return;
    case '\b': out += "\\b"; return;
    case '\f': out += "\\f"; return;
    default: break;
  }
  if (cp < 0x20 || (cp >= 0xD800 && cp <= 0xDFFF)) {
    out += "\\u";
    for (int s = 12; s >= 0; s -= 4) out.push_back(hex[(cp >> s) & 15]);
    return;
  }
  append_utf8(out, cp);
}

// Python json's NUMBER_RE, matched in full: -?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?
bool valid_number(std::string_view s, bool& is_int) {
  size_t i = 0;
  auto digits = [&] {
    size_t b = i;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    return i - b;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') ++i;
  else if (digits() == 0) return false;
  is_int = true;
  if (i < s.size() && s[i] == '.') {
    ++i, is_int = false;
    if (digits() == 0) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i, is_int = false;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == s.size();
}

// What json.dumps(json.loads(s)) writes for a valid number literal: ints exactly (Python ints
// have no size limit; "-0" is 0), floats as repr, out-of-range floats as Infinity.
std::string py_number(const std::string& s, bool is_int) {
  if (is_int) return s.find_first_not_of("-0") == std::string::npos ? "0" : s;
  double v = std::strtod(s.c_str(), nullptr);
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  return py_float_repr(v);
}

constexpr std::string_view kLiterals[] = {"true", "false", "null", "NaN", "Infinity", "-Infinity"};
}  // namespace

class HermesToolParser::CallReader {
 public:
  enum class Status { More, Done, Error };

  // Consumes one byte. Error: the byte is not valid here (it is not consumed).
  Status feed(char c) {
    if (failed_) return Status::Error;
    if (lex_ == Lex::String) return string_char(c) ? status() : fail();
    if (lex_ == Lex::Literal) {
      lit_.push_back(c);
      bool prefix = false;
      for (auto l : kLiterals) {
        if (l == lit_) return end_scalar(std::string(l)) ? status() : fail();
        prefix = prefix || l.substr(0, lit_.size()) == lit_;
      }
      if (!prefix) {
        lit_.pop_back();
        return fail();
      }
      return Status::More;
    }
    if (lex_ == Lex::Number) {
      if ((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-') {
        num_.push_back(c);
        return Status::More;
      }
      if (num_ == "-" && c == 'I') {  // -Infinity
        lex_ = Lex::Literal;
        lit_ = "-I";
        return Status::More;
      }
      if (!end_number()) return fail();
      // c is the byte after the number: structural, handled below.
    }
    if (json_ws(c)) return Status::More;
    switch (expect_) {
      case Expect::ValueOrEnd:
        if (c == ']') return close_container() ? status() : fail();
        [[fallthrough]];
      case Expect::Value: return begin_value(c) ? Status::More : fail();
      case Expect::KeyOrEnd:
        if (c == '}') return close_container() ? status() : fail();
        [[fallthrough]];
      case Expect::Key:
        if (c != '"') return fail();
        begin_string(Str::Key);
        return Status::More;
      case Expect::Colon:
        if (c != ':') return fail();
        expect_ = Expect::Value;
        return Status::More;
      case Expect::CommaOrEnd: {
        bool obj = stack_.back().obj;
        if (c == ',') {
          expect_ = obj ? Expect::Key : Expect::Value;
          return Status::More;
        }
        if (c == (obj ? '}' : ']')) return close_container() ? status() : fail();
        return fail();
      }
      case Expect::Done: return fail();
    }
    return fail();
  }

  bool has_name() const { return has_name_; }
  const std::string& name() const { return name_; }
  // Arguments text decided since the last call.
  std::string take_args() {
    std::string s = std::move(out_);
    out_.clear();
    return s;
  }
  // The object ended (Done): "{}" when it had no arguments (vLLM streams that).
  std::string finish_args() { return args_written_ ? std::string() : "{}"; }
  // The object is cut off or broken after its name: the text that closes what was written of
  // the arguments into valid JSON (a pending number is completed, a pending literal dropped).
  std::string close_args() {
    if (lex_ == Lex::Number && emit_scalar_) end_number();
    if (lex_ == Lex::String && str_ == Str::Emit) {
      flush_high();
      put('"');
    }
    for (auto it = stack_.rbegin(); it != stack_.rend(); ++it)
      if (it->emit) put(it->obj ? '}' : ']');
    std::string s = take_args();
    return s + finish_args();
  }

 private:
  enum class Expect { Value, ValueOrEnd, KeyOrEnd, Key, Colon, CommaOrEnd, Done };
  enum class Lex { None, String, Number, Literal };
  enum class Str { Key, Name, Emit, Skip };
  enum class Esc { None, Backslash, Hex };
  struct Frame {
    bool obj;
    bool emit;  // inside the arguments value: written out
    int count = 0;
  };

  Status fail() {
    failed_ = true;
    return Status::Error;
  }
  Status status() const { return expect_ == Expect::Done ? Status::Done : Status::More; }
  void put(char c) {
    out_.push_back(c);
    args_written_ = true;
  }
  void put(std::string_view s) {
    out_.append(s);
    args_written_ = true;
  }

  // How the value starting now is treated: at depth 1 it is a member of the call object.
  enum class Role { Name, Args, Emit, Skip };
  Role role() {
    if (stack_.size() == 1) {
      if (key_ == "name" && !has_name_) return Role::Name;
      if (key_ == "arguments" && !args_seen_) {
        args_seen_ = true;
        return Role::Args;
      }
      return Role::Skip;
    }
    return stack_.back().emit ? Role::Emit : Role::Skip;
  }
  // Separator and key before a written value inside a written container.
  void write_prefix(Role r) {
    if (r != Role::Emit) return;
    Frame& f = stack_.back();
    if (f.count++) put(", ");
    if (f.obj) {
      put('"');
      put(key_);
      put("\": ");
    }
  }

  bool begin_value(char c) {
    if (stack_.empty()) {  // the call itself must be an object
      if (c != '{') return false;
      stack_.push_back({true, false});
      expect_ = Expect::KeyOrEnd;
      return true;
    }
    Role r = role();
    if (r == Role::Name && c != '"') return false;  // a name that is not a string
    bool emit = r == Role::Args || r == Role::Emit;
    if (c == '{' || c == '[') {
      if (emit) write_prefix(r), put(c);
      stack_.push_back({c == '{', emit});
      expect_ = c == '{' ? Expect::KeyOrEnd : Expect::ValueOrEnd;
      return true;
    }
    if (c == '"') {
      if (emit) write_prefix(r), put('"');
      begin_string(r == Role::Name ? Str::Name : emit ? Str::Emit : Str::Skip);
      return true;
    }
    emit_scalar_ = emit;
    scalar_role_ = r;
    if (c == '-' || (c >= '0' && c <= '9')) {
      lex_ = Lex::Number;
      num_.assign(1, c);
      return true;
    }
    for (auto l : kLiterals)
      if (l[0] == c) {
        lex_ = Lex::Literal;
        lit_.assign(1, c);
        return true;
      }
    return false;
  }

  bool end_number() {
    bool is_int = false;
    if (!valid_number(num_, is_int)) return false;
    return end_scalar(py_number(num_, is_int));
  }
  bool end_scalar(const std::string& text) {
    lex_ = Lex::None;
    if (emit_scalar_) write_prefix(scalar_role_), put(text);
    after_value();
    return true;
  }
  void after_value() { expect_ = stack_.empty() ? Expect::Done : Expect::CommaOrEnd; }
  bool close_container() {
    Frame f = stack_.back();
    stack_.pop_back();
    if (f.emit) put(f.obj ? '}' : ']');
    after_value();
    return true;
  }

  void begin_string(Str kind) {
    lex_ = Lex::String;
    str_ = kind;
    esc_ = Esc::None;
    high_ = -1;
    text_.clear();
  }
  // One decoded code point of the current string (raw UTF-8 bytes pass through put_byte).
  void put_cp(uint32_t cp) {
    if (str_ == Str::Name) {
      append_utf8(text_, cp >= 0xD800 && cp <= 0xDFFF ? 0xFFFD : cp);
      return;
    }
    std::string s;
    append_py_char(s, cp);
    if (str_ == Str::Emit) put(s);
    else if (str_ == Str::Key) text_ += s;  // keys are kept in their written form
  }
  void put_byte(char c) {
    if (str_ == Str::Emit) put(c);
    else if (str_ != Str::Skip) text_.push_back(c);
  }
  void flush_high() {
    if (high_ >= 0) put_cp(static_cast<uint32_t>(high_));
    high_ = -1;
  }
  bool string_char(char c) {
    unsigned char u = static_cast<unsigned char>(c);
    if (esc_ == Esc::Hex) {
      int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
      if (d < 0) return false;
      hex_ = hex_ * 16 + static_cast<uint32_t>(d);
      if (++hex_n_ < 4) return true;
      esc_ = Esc::None;
      if (high_ >= 0 && hex_ >= 0xDC00 && hex_ <= 0xDFFF) {  // a surrogate pair: one character
        put_cp(0x10000 + ((static_cast<uint32_t>(high_) - 0xD800) << 10) + (hex_ - 0xDC00));
        high_ = -1;
        return true;
      }
      flush_high();
      if (hex_ >= 0xD800 && hex_ <= 0xDBFF) high_ = static_cast<int32_t>(hex_);
      else put_cp(hex_);
      return true;
    }
    if (esc_ == Esc::Backslash) {
      esc_ = Esc::None;
      uint32_t cp;
      switch (c) {
        case 'u': esc_ = Esc::Hex, hex_ = 0, hex_n_ = 0; return true;
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        default: return false;
      }
      flush_high();
      put_cp(cp);
      return true;
    }
    if (c == '\\') {
      esc_ = Esc::Backslash;
      return true;
    }
    flush_high();
    if (c == '"') return end_string();
    if (u < 0x20) return false;  // json.loads is strict: no raw control characters
    put_byte(c);
    return true;
  }
  bool end_string() {
    lex_ = Lex::None;
    switch (str_) {
      case Str::Key:
        key_ = std::move(text_);
        expect_ = Expect::Colon;
        return true;
      case Str::Name:
        if (text_.empty()) return false;  // vLLM never streams an empty name
        name_ = std::move(text_);
        has_name_ = true;
        break;
      case Str::Emit: put('"'); break;
      case Str::Skip: break;
    }
    after_value();
    return true;
  }

  std::vector<Frame> stack_;
  Expect expect_ = Expect::Value;
  Lex lex_ = Lex::None;
  bool failed_ = false;
  std::string key_;  // the current member's key, in its written (escaped) form
  std::string name_;
  bool has_name_ = false, args_seen_ = false, args_written_ = false;
  std::string out_;  // arguments text not yet taken
  // strings
  Str str_ = Str::Skip;
  Esc esc_ = Esc::None;
  uint32_t hex_ = 0;
  int hex_n_ = 0;
  int32_t high_ = -1;  // a high surrogate waiting for its low half
  std::string text_;   // key or name being read
  // numbers and literals
  std::string num_, lit_;
  bool emit_scalar_ = false;
  Role scalar_role_ = Role::Skip;
};

HermesToolParser::HermesToolParser(const ojson& tools) { (void)tools; }
HermesToolParser::~HermesToolParser() = default;

void HermesToolParser::emit_content(std::string_view s, ToolParseDelta& out) {
  if (!any_call_) out.content.append(s);
}

void HermesToolParser::begin_block() {
  reader_ = std::make_unique<CallReader>();
  raw_ = kCallStart;
  announced_ = false;
  state_ = State::Open;
}

void HermesToolParser::announce(ToolParseDelta& out) {
  calls_.push_back({random_call_id(), reader_->name(), ""});
  ToolCallDelta d;
  d.index = static_cast<int>(calls_.size()) - 1;
  d.id = calls_.back().id;
  d.name = calls_.back().name;
  out.calls.push_back(std::move(d));
  announced_ = any_call_ = true;
  raw_.clear();
}

void HermesToolParser::flush_args(ToolParseDelta& out) {
  std::string s = reader_->take_args();
  if (s.empty()) return;
  calls_.back().arguments += s;
  int index = static_cast<int>(calls_.size()) - 1;
  // One arguments fragment per push and call (the name delta stays on its own).
  if (!out.calls.empty() && out.calls.back().index == index && !out.calls.back().name) out.calls.back().arguments += s;
  else out.calls.push_back({index, std::nullopt, std::nullopt, std::move(s)});
}

void HermesToolParser::close_call(ToolParseDelta& out) {
  std::string s = reader_->close_args();
  if (s.empty()) return;
  ToolCallDelta d;
  d.index = static_cast<int>(calls_.size()) - 1;
  d.arguments = std::move(s);
  calls_.back().arguments += d.arguments;
  out.calls.push_back(std::move(d));
}

void HermesToolParser::push(std::string_view text, ToolParseDelta& out) {
  buf_.append(text);
  step(out);
}

void HermesToolParser::finish(ToolParseDelta& out) {
  step(out);
  switch (state_) {
    case State::Content:
    case State::Malformed: emit_content(buf_, out); break;
    case State::Open:
      if (announced_) close_call(out);
      else emit_content(raw_ + buf_, out);  // cut off before a name: content
      break;
    case State::Tail: break;
  }
  buf_.clear();
  raw_.clear();
  state_ = State::Content;
}

void HermesToolParser::step(ToolParseDelta& out) {
  size_t i = 0;  // bytes of buf_ consumed
  for (;;) {
    std::string_view rest = std::string_view(buf_).substr(i);
    switch (state_) {
      case State::Content: {  // outside blocks: content until the first call, then dropped
        size_t pos = rest.find(kCallStart);
        if (pos == std::string_view::npos) {
          size_t n = rest.size() - partial_marker_suffix(rest, kCallStart);
          emit_content(rest.substr(0, n), out);
          buf_.erase(0, i + n);
          return;
        }
        emit_content(rest.substr(0, pos), out);
        i += pos + kCallStart.size();
        begin_block();
        break;
      }
      case State::Open: {
        using S = CallReader::Status;
        S st = S::More;
        while (i < buf_.size()) {
          char c = buf_[i];
          st = reader_->feed(c);
          if (st == S::Error) break;  // c is not consumed
          ++i;
          if (!announced_) {
            raw_.push_back(c);
            if (reader_->has_name()) announce(out);
          }
          if (announced_) flush_args(out);
          if (st == S::Done) break;
        }
        if (st == S::More) {
          buf_.erase(0, i);
          return;
        }
        if (!announced_) {  // not a call: the block is content up to its "</tool_call>"
          emit_content(raw_, out);
          raw_.clear();
          state_ = State::Malformed;
        } else {
          if (st == S::Done) {
            std::string s = reader_->finish_args();
            if (!s.empty()) {
              calls_.back().arguments += s;
              out.calls.push_back({static_cast<int>(calls_.size()) - 1, std::nullopt, std::nullopt, s});
            }
          } else {
            close_call(out);
          }
          state_ = State::Tail;
        }
        break;
      }
      case State::Tail: {  // after a call's JSON: skip to "</tool_call>" (or a next "<tool_call>")
        size_t e = rest.find(kCallEnd), s = rest.find(kCallStart);
        if (e == std::string_view::npos && s == std::string_view::npos) {
          size_t keep = std::max(partial_marker_suffix(rest, kCallEnd), partial_marker_suffix(rest, kCallStart));
          buf_.erase(0, buf_.size() - keep);
          return;
        }
        if (e < s) {
          i += e + kCallEnd.size();
          state_ = State::Content;
        } else {
          i += s + kCallStart.size();
          begin_block();
        }
        break;
      }
      case State::Malformed: {  // a block that is not a call: content through "</tool_call>"
        size_t e = rest.find(kCallEnd);
        if (e == std::string_view::npos) {
          size_t n = rest.size() - partial_marker_suffix(rest, kCallEnd);
          emit_content(rest.substr(0, n), out);
          buf_.erase(0, i + n);
          return;
        }
        emit_content(rest.substr(0, e + kCallEnd.size()), out);
        i += e + kCallEnd.size();
        state_ = State::Content;
        break;
      }
    }
  }
}

}  // namespace moeserve::server
