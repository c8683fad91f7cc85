// The chat page served at / (`moeserve serve`, unless --no-web-ui): one self-contained
// HTML file (src/server/web_ui/index.html: markup, CSS and JS inline, no external
// resource, so it works offline) compiled into the binary at build time by
// cmake/embed_file.cmake. The page talks to the same server through /v1/models and
// /v1/chat/completions (streamed), sending the API key the user types when one is needed.
#pragma once
#include <cstddef>
#include <string_view>

namespace moeserve::server {

extern const char kWebUiPage[];
extern const std::size_t kWebUiPage_size;

inline std::string_view web_ui_page() { return {kWebUiPage, kWebUiPage_size}; }

// Headers the page is answered with: it may only talk to its own origin and load nothing.
inline constexpr const char* kWebUiCsp =
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
    "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

}  // namespace moeserve::server
