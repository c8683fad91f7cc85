# Helpers shared by every area's CMakeLists.txt.
# moeserve_library(NAME SOURCES... [DEPS ...]) defines moeserve_<NAME> and records it
# in the global MOESERVE_LIBS list (order of registration = link order of the binary).
function(moeserve_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(moeserve_${name} STATIC ${ARG_SOURCES})
  target_include_directories(moeserve_${name} PUBLIC ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(moeserve_${name} PUBLIC ${ARG_DEPS})
  set_property(GLOBAL APPEND PROPERTY MOESERVE_LIBS moeserve_${name})
endfunction()

# moeserve_test(NAME SOURCES... LIBS... LABELS...) adds a GoogleTest executable and
# registers each of its tests with CTest under the given labels.
function(moeserve_test name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_LIBS} GTest::gtest GTest::gtest_main GTest::gmock)
  target_compile_definitions(${name} PRIVATE MOESERVE_TEST_SHARED_DATA="${CMAKE_SOURCE_DIR}/tests/fixtures/shared-data")
  gtest_discover_tests(${name} PROPERTIES LABELS "${ARG_LABELS}"
    ENVIRONMENT "MOESERVE_SOURCE_DIR=${CMAKE_SOURCE_DIR};MOESERVE_BINARY_DIR=${CMAKE_BINARY_DIR};MOESERVE_SHARED_DATA=${CMAKE_SOURCE_DIR}/tests/fixtures/shared-data"
    DISCOVERY_TIMEOUT 60)
endfunction()

# moeserve_fuzz_target(NAME SOURCES... LIBS... [SEEDS files-or-folders...]) (tests/fuzz):
# a libFuzzer binary when MOESERVE_FUZZ is on, else a `<name>_replay` unit test over
# tests/fuzz/seeds/<name>/, tests/fuzz/regressions/<name>/ and SEEDS. The seed list for
# scripts/fuzz.sh is written to <build>/fuzz/<name>.seeds, one path a line.
function(moeserve_fuzz_target name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS;SEEDS" ${ARGN})
  set(dirs ${CMAKE_CURRENT_SOURCE_DIR}/seeds/${name} ${CMAKE_CURRENT_SOURCE_DIR}/regressions/${name})
  set(exe ${name})
  if(NOT MOESERVE_FUZZ)
    set(exe ${name}_replay)
  endif()
  add_executable(${exe} ${ARG_SOURCES})
  target_link_libraries(${exe} PRIVATE ${ARG_LIBS})
  target_compile_definitions(${exe} PRIVATE MOESERVE_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  if(MOESERVE_FUZZ)
    target_link_options(${exe} PRIVATE -fsanitize=fuzzer)
    set_target_properties(${exe} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
    string(REPLACE ";" "\n" seed_lines "${dirs};${ARG_SEEDS}")
    file(WRITE ${CMAKE_BINARY_DIR}/fuzz/${name}.seeds "${seed_lines}\n")
    add_dependencies(fuzz_all ${exe})
  else()
    target_sources(${exe} PRIVATE ${CMAKE_SOURCE_DIR}/tests/fuzz/replay_main.cpp)
    add_test(NAME ${name}_replay COMMAND ${exe} ${dirs} ${ARG_SEEDS})
    set_tests_properties(${name}_replay PROPERTIES LABELS unit TIMEOUT 600)
  endif()
endfunction()
