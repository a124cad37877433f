// mpigrad-check-links ROOT: every relative link of ROOT/README.md and of the Markdown pages under
// ROOT/docs/ must resolve. A link's path is taken from the page's own folder and must name a file
// or folder inside ROOT; a "#anchor" (alone, or after a .md path) must be the anchor of one of
// that page's headings, as GitHub derives it: the heading's text, lowercased, with punctuation
// dropped and spaces turned into hyphens, and "-1", "-2", ... added to repeats.
//
// Links are `[text](target)`, `![alt](target)` and reference definitions `[label]: target`,
// outside fenced code blocks and inline code spans. Targets with a scheme (https:, mailto:) are
// not checked: they are not files of the repository.
//
// Prints one line per broken link, "page:line: broken link 'target': why", and exits 1 if any;
// otherwise prints how many links it checked and exits 0.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

struct Link {
  int line = 0;
  std::string target;
};

// A page's lines outside fenced code blocks, with inline code spans blanked out, so that neither
// a code sample's brackets nor its "# comment" lines count as links or headings.
struct ProseLine {
  int number = 0;    // 1-based
  std::string text;  // code spans blanked
  std::string raw;   // as written (a heading's anchor keeps the words of its code spans)
};
struct Page {
  std::vector<ProseLine> prose;
};

bool is_fence(const std::string& line, std::string& fence) {
  size_t indent = 0;
  while (indent < line.size() && indent < 4 && line[indent] == ' ') ++indent;
  if (indent == 4 || indent >= line.size()) return false;
  const char c = line[indent];
  if (c != '`' && c != '~') return false;
  size_t run = 0;
  while (indent + run < line.size() && line[indent + run] == c) ++run;
  if (run < 3) return false;
  fence = std::string(run, c);
  return true;
}

std::string blank_code_spans(const std::string& line) {
  std::string out = line;
  size_t i = 0;
  while (i < out.size()) {
    if (out[i] != '`') {
      ++i;
      continue;
    }
    size_t run = 0;
    while (i + run < out.size() && out[i + run] == '`') ++run;
    const std::string ticks(run, '`');
    size_t close = out.find(ticks, i + run);
    // A closing run must be exactly as long: skip longer runs.
    while (close != std::string::npos && close + run < out.size() && out[close + run] == '`') {
      size_t longer = close;
      while (longer < out.size() && out[longer] == '`') ++longer;
      close = out.find(ticks, longer);
    }
    if (close == std::string::npos) {
      i += run;  // an unmatched run is literal text
      continue;
    }
    std::fill(out.begin() + long(i), out.begin() + long(close + run), ' ');
    i = close + run;
  }
  return out;
}

Page read_page(const fs::path& path) {
  Page page;
  std::ifstream file(path);
  std::string line, fence;
  int number = 0;
  bool in_fence = false;
  while (std::getline(file, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string this_fence;
    if (is_fence(line, this_fence)) {
      if (!in_fence) {
        in_fence = true;
        fence = this_fence;
        continue;
      }
      // A closing fence is the same character, at least as many, and nothing else on the line.
      const char closing[] = {' ', fence[0], '\0'};
      if (this_fence.size() >= fence.size() && this_fence[0] == fence[0] &&
          line.find_first_not_of(closing) == std::string::npos) {
        in_fence = false;
        continue;
      }
    }
    if (!in_fence) page.prose.push_back({number, blank_code_spans(line), line});
  }
  return page;
}

// The link destination that starts at `begin` (just after "("): up to the matching ")", without
// an optional title ("... \"title\"") or angle brackets.
std::string destination(const std::string& line, size_t begin) {
  if (begin < line.size() && line[begin] == '<') {
    const size_t close = line.find('>', begin);
    return close == std::string::npos ? "" : line.substr(begin + 1, close - begin - 1);
  }
  int depth = 0;
  size_t end = begin;
  for (; end < line.size(); ++end) {
    const char c = line[end];
    if (c == '(') ++depth;
    if (c == ')' && depth-- == 0) break;
    if (c == ' ' && depth == 0) break;  // a title follows
  }
  return line.substr(begin, end - begin);
}

std::vector<Link> links_of(const Page& page) {
  std::vector<Link> links;
  for (const ProseLine& line : page.prose) {
    const std::string& text = line.text;
    // Reference definitions: "[label]: target" at the start of a line.
    const size_t first = text.find_first_not_of(' ');
    if (first != std::string::npos && first < 4 && text[first] == '[') {
      const size_t close = text.find(']', first);
      if (close != std::string::npos && close + 1 < text.size() && text[close + 1] == ':') {
        size_t start = text.find_first_not_of(' ', close + 2);
        if (start != std::string::npos) {
          links.push_back({line.number, text.substr(start, text.find(' ', start) - start)});
        }
        continue;
      }
    }
    for (size_t at = text.find("]("); at != std::string::npos; at = text.find("](", at + 2)) {
      std::string target = destination(text, at + 2);
      if (!target.empty()) links.push_back({line.number, target});
    }
  }
  return links;
}

bool has_scheme(const std::string& target) {
  if (target.starts_with("//")) return true;
  const size_t colon = target.find(':');
  if (colon == std::string::npos || colon == 0) return false;
  return std::all_of(target.begin(), target.begin() + long(colon), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
  });
}

// Drops Markdown that GitHub does not show as text before it makes the anchor: a link keeps its
// text, an image its alt text; emphasis and code markers go with the punctuation later.
std::string rendered_text(const std::string& heading) {
  std::string out;
  for (size_t i = 0; i < heading.size(); ++i) {
    if (heading[i] == ']' && i + 1 < heading.size() && heading[i + 1] == '(') {
      const size_t close = heading.find(')', i);
      if (close != std::string::npos) {
        i = close;
        continue;
      }
    }
    out += heading[i];
  }
  return out;
}

// GitHub's anchor for a heading's text. ASCII letters and digits are kept (lowercased), as are
// '-' and '_'; a space becomes '-'; other ASCII is dropped. Other characters are kept as they are,
// except the common punctuation and symbols of Latin-1 and of U+2000-U+206F (dashes, quotes),
// which GitHub drops too; headings whose anchors are linked keep to ASCII to be safe.
std::string anchor_of(const std::string& heading) {
  const std::string text = rendered_text(heading);
  std::string anchor;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (std::isalnum(c)) anchor += char(std::tolower(c));
      if (c == '-' || c == '_') anchor += char(c);
      if (c == ' ') anchor += '-';
      ++i;
      continue;
    }
    size_t length = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
    length = std::min(length, text.size() - i);
    const std::string character = text.substr(i, length);
    const unsigned char second = length > 1 ? static_cast<unsigned char>(character[1]) : 0;
    const bool latin1_symbol = c == 0xC2 || (c == 0xC3 && (second == 0x97 || second == 0xB7));
    const bool general_punctuation = c == 0xE2 && (second == 0x80 || second == 0x81);
    if (!latin1_symbol && !general_punctuation) anchor += character;
    i += length;
  }
  return anchor;
}

std::set<std::string> anchors_of(const Page& page) {
  std::set<std::string> anchors;
  std::map<std::string, int> seen;
  for (const ProseLine& line : page.prose) {
    const std::string& text = line.raw;
    size_t hashes = 0;
    while (hashes < text.size() && text[hashes] == '#') ++hashes;
    if (hashes == 0 || hashes > 6 || hashes >= text.size() || text[hashes] != ' ') continue;
    std::string heading = text.substr(hashes + 1);
    while (!heading.empty() && (heading.back() == ' ' || heading.back() == '#')) heading.pop_back();
    std::string anchor = anchor_of(heading);
    const int repeat = seen[anchor]++;
    anchors.insert(repeat == 0 ? anchor : anchor + "-" + std::to_string(repeat));
  }
  return anchors;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s ROOT\n", argv[0]);
    return 2;
  }
  const fs::path root = fs::weakly_canonical(argv[1]);
  std::vector<fs::path> pages;
  if (fs::exists(root / "README.md")) pages.push_back(root / "README.md");
  if (fs::is_directory(root / "docs")) {
    for (const auto& entry : fs::recursive_directory_iterator(root / "docs")) {
      if (entry.is_regular_file() && entry.path().extension() == ".md") {
        pages.push_back(entry.path());
      }
    }
  }
  std::sort(pages.begin(), pages.end());
  if (pages.empty()) {
    std::fprintf(stderr, "check-links: no README.md and no docs/*.md under %s\n",
                 root.string().c_str());
    return 1;
  }
  std::map<fs::path, Page> cache;
  auto page_at = [&](const fs::path& path) -> const Page& {
    auto found = cache.find(path);
    if (found == cache.end()) found = cache.emplace(path, read_page(path)).first;
    return found->second;
  };
  int checked = 0, broken = 0;
  for (const fs::path& path : pages) {
    const std::string name = fs::relative(path, root).string();
    for (const Link& link : links_of(page_at(path))) {
      if (has_scheme(link.target)) continue;
      ++checked;
      auto report = [&](const std::string& why) {
        std::printf("%s:%d: broken link '%s': %s\n", name.c_str(), link.line, link.target.c_str(),
                    why.c_str());
        ++broken;
      };
      const size_t hash = link.target.find('#');
      const std::string file_part = link.target.substr(0, hash);
      const std::string anchor = hash == std::string::npos ? "" : link.target.substr(hash + 1);
      fs::path target = path;
      if (!file_part.empty()) {
        target = fs::weakly_canonical(path.parent_path() / file_part);
        const std::string inside = fs::relative(target, root).string();
        if (inside.empty() || inside.starts_with("..")) {
          report("it leads outside the repository");
          continue;
        }
        if (!fs::exists(target)) {
          report("no file " + inside);
          continue;
        }
      }
      if (anchor.empty()) continue;
      if (target.extension() != ".md" || !fs::is_regular_file(target)) {
        report("an anchor on a file that is not a Markdown page");
        continue;
      }
      if (!anchors_of(page_at(target)).count(anchor)) {
        report(fs::relative(target, root).string() + " has no heading with the anchor '" + anchor +
               "'");
      }
    }
  }
  if (broken > 0) {
    std::printf("check-links: %d broken link(s) of %d checked in %zu page(s)\n", broken, checked,
                pages.size());
    return 1;
  }
  std::printf("check-links: %d relative links in %zu page(s) resolve\n", checked, pages.size());
  return 0;
}
