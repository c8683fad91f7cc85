# moeserve_embed_file(OUT_CPP SYMBOL PATH): generates OUT_CPP defining
#   std::string_view SYMBOL();
# returning the bytes of PATH (embedded at build time, so the binary needs no asset files).
function(moeserve_embed_file out_cpp symbol path)
  add_custom_command(
    OUTPUT ${out_cpp}
    COMMAND ${CMAKE_COMMAND} -DIN=${path} -DOUT=${out_cpp} -DSYMBOL=${symbol}
            -P ${CMAKE_SOURCE_DIR}/cmake/embed_run.cmake
    DEPENDS ${path} ${CMAKE_SOURCE_DIR}/cmake/embed_run.cmake
    COMMENT "Embedding ${path}")
endfunction()
