// The configuration reference page, docs/configuration.md, rendered from the key table
// (config_keys(), launch/config/train_config.cpp): one Markdown table per section, one row per
// key with its default, the values its parser accepts and its help. The page is generated, never
// written by hand, so it cannot drift from the parser: tests/docs prints it with
// mpigrad-config-reference and fails when the committed page differs.
#pragma once

#include <string>

namespace mpigrad::launch {

// The command, run from the repository root after scripts/build.sh, that rewrites the page.
inline constexpr const char* kConfigReferenceCommand =
    "build/tests/docs/mpigrad-config-reference -o docs/configuration.md";

// The whole page, ending in one newline; the same text on every machine.
std::string config_reference_markdown();

// `text` as the content of one Markdown table cell: '|' and '*' escaped, line breaks as spaces.
std::string markdown_table_cell(const std::string& text);

}  // namespace mpigrad::launch
