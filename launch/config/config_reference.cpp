#include "mpigrad/launch/config/config_reference.h"

#include <sstream>

#include "mpigrad/launch/config/train_config.h"

namespace mpigrad::launch {

std::string markdown_table_cell(const std::string& text) {
  std::string cell;
  cell.reserve(text.size());
  for (char c : text) {
    if (c == '|' || c == '*') {  // a cell divider; emphasis ("ckpt-epoch*.h5" twice in a row)
      cell += '\\';
      cell += c;
    } else if (c == '\n' || c == '\r') {
      cell += ' ';
    } else {
      cell += c;
    }
  }
  return cell;
}

namespace {

// A code span holding `text`; a backtick inside would end it, so such text gets two. Inside a
// code span only '|' needs its escape (the table's, which GitHub applies first).
std::string code_cell(const std::string& text) {
  const bool has_backtick = text.find('`') != std::string::npos;
  std::string cell = has_backtick ? "`` " : "`";
  for (char c : text) {
    if (c == '|') cell += '\\';
    cell += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return cell + (has_backtick ? " ``" : "`");
}

}  // namespace

std::string config_reference_markdown() {
  std::ostringstream out;
  out << "# Configuration reference\n\n"
      << "Every key of `mpigrad train`, section by section. In a config file a key is\n"
      << "`key = value` under its `[section]`; on the command line it is `--section.key=value`,\n"
      << "which overrides the file. `mpigrad lr-find`, `swa` and `embed` read the same file, and\n"
      << "the C API reads some of the sections ([Embedding](embedding.md#the-config)).\n"
      << "How a run reads its data, checks it and writes its results: [Training](training.md).\n\n"
      << "This page is generated from the key table in `launch/config/train_config.cpp`, where\n"
      << "each key is declared once: its parser, its default, `mpigrad train --help` and the\n"
      << "resolved `config.ini` of every run follow from the same row. After changing a key,\n"
      << "rebuild and run, from the repository root,\n\n"
      << "```sh\n"
      << kConfigReferenceCommand << "\n"
      << "```\n\n"
      << "The test `docs_configuration_reference` fails while this page and the table differ.\n";
  std::string section;
  for (const ConfigKey& key : config_keys()) {
    if (key.section() != section) {
      section = key.section();
      out << "\n## `[" << section << "]`\n\n"
          << "| key | default | accepted | what it does |\n"
          << "|---|---|---|---|\n";
    }
    const std::string default_text = key.default_text();
    out << "| " << code_cell(key.key()) << " | "
        << (default_text.empty() ? std::string("(empty)") : code_cell(default_text)) << " | "
        << markdown_table_cell(key.accepted) << " | " << markdown_table_cell(key.help) << " |\n";
  }
  return out.str();
}

}  // namespace mpigrad::launch
