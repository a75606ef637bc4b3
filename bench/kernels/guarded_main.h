// The kernel bench programs' main: runs `run` and turns an escaping exception (a CUDA error, a bad
// size) into one line named after the program and exit status 1.
#pragma once

#include <cstdio>
#include <exception>

inline int guarded_main(const char* program, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}
