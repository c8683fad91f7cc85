# Script mode helper for moeserve_embed_file: IN, OUT, SYMBOL.
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE ${OUT} "// Generated from ${IN}; do not edit.\n#include <string_view>\nnamespace moeserve {\nstatic const unsigned char k${SYMBOL}[] = {\n${body}0};\nstd::string_view ${SYMBOL}() { return {reinterpret_cast<const char*>(k${SYMBOL}), ${bytes}}; }\n}  // namespace moeserve\n")
