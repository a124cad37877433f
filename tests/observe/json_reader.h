// A small, strict JSON reader for the tests of the timeline and of TensorBoard's files: it
// parses the whole grammar (objects, arrays, strings with escapes, numbers, true, false, null)
// and throws std::runtime_error naming the byte offset of the first thing that is not JSON, so
// "the trace is well-formed JSON" is a real check without Python in the required tests.
#pragma once

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mpigrad::test {

struct JsonValue {
  enum class Kind { Null, Boolean, Number, String, Array, Object };
  Kind kind = Kind::Null;
  bool boolean = false;
  double number = 0;
  std::string text;
  std::vector<JsonValue> items;                            // Array
  std::vector<std::pair<std::string, JsonValue>> members;  // Object, in file order

  bool is(Kind k) const { return kind == k; }
  // The member `key` of an object, or null when absent (or not an object).
  const JsonValue* find(std::string_view key) const {
    for (const auto& [name, value] : members) {
      if (name == key) return &value;
    }
    return nullptr;
  }
};

class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : text_(text) {}

  JsonValue parse_document() {
    JsonValue value = parse_value();
    skip_space();
    if (at_ != text_.size()) fail("text after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("JSON: " + what + " at byte " + std::to_string(at_));
  }
  void skip_space() {
    while (at_ < text_.size() &&
           (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\r' || text_[at_] == '\t')) {
      ++at_;
    }
  }
  char peek() {
    skip_space();
    if (at_ >= text_.size()) fail("unexpected end");
    return text_[at_];
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++at_;
  }
  void expect_word(std::string_view word) {
    if (text_.substr(at_, word.size()) != word) fail("expected " + std::string(word));
    at_ += word.size();
  }

  JsonValue parse_value() {
    JsonValue value;
    const char c = peek();
    if (c == '{') {
      value.kind = JsonValue::Kind::Object;
      ++at_;
      if (peek() == '}') {
        ++at_;
        return value;
      }
      while (true) {
        if (peek() != '"') fail("expected a member name");
        std::string name = parse_string();
        expect(':');
        value.members.emplace_back(std::move(name), parse_value());
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect('}');
        return value;
      }
    }
    if (c == '[') {
      value.kind = JsonValue::Kind::Array;
      ++at_;
      if (peek() == ']') {
        ++at_;
        return value;
      }
      while (true) {
        value.items.push_back(parse_value());
        if (peek() == ',') {
          ++at_;
          continue;
        }
        expect(']');
        return value;
      }
    }
    if (c == '"') {
      value.kind = JsonValue::Kind::String;
      value.text = parse_string();
      return value;
    }
    if (c == 't' || c == 'f') {
      value.kind = JsonValue::Kind::Boolean;
      value.boolean = c == 't';
      expect_word(c == 't' ? "true" : "false");
      return value;
    }
    if (c == 'n') {
      expect_word("null");
      return value;
    }
    value.kind = JsonValue::Kind::Number;
    value.number = parse_number();
    return value;
  }

  std::string parse_string() {
    expect('"');
    std::string out;
    while (true) {
      if (at_ >= text_.size()) fail("unterminated string");
      const char c = text_[at_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (at_ >= text_.size()) fail("unterminated escape");
      const char e = text_[at_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          if (at_ + 4 > text_.size()) fail("short \\u escape");
          const std::string hex(text_.substr(at_, 4));
          char* end = nullptr;
          const long code = std::strtol(hex.c_str(), &end, 16);
          if (end != hex.c_str() + 4) fail("bad \\u escape");
          at_ += 4;
          if (code < 0x80) {
            out.push_back(char(code));
          } else {
            out.push_back('?');  // the tests only compare ASCII
          }
          break;
        }
        default:
          fail("bad escape");
      }
    }
  }

  double parse_number() {
    // JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
    const size_t start = at_;
    auto digits = [&] {
      const size_t first = at_;
      while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') ++at_;
      if (at_ == first) fail("expected a digit");
    };
    if (text_[at_] == '-') ++at_;
    if (at_ < text_.size() && text_[at_] == '0') {
      ++at_;
    } else {
      digits();
    }
    if (at_ < text_.size() && text_[at_] == '.') {
      ++at_;
      digits();
    }
    if (at_ < text_.size() && (text_[at_] == 'e' || text_[at_] == 'E')) {
      ++at_;
      if (at_ < text_.size() && (text_[at_] == '+' || text_[at_] == '-')) ++at_;
      digits();
    }
    return std::strtod(std::string(text_.substr(start, at_ - start)).c_str(), nullptr);
  }

  std::string_view text_;
  size_t at_ = 0;
};

inline JsonValue parse_json(std::string_view text) {
  return JsonReader(text).parse_document();
}

}  // namespace mpigrad::test
