# One library target per layer, and include roots that make the layering a build rule.
#
# A layer's headers are reachable only through its own include root: a folder in the build tree
# holding one symbolic link named after the layer (build/layer_roots/nsa_model/model -> src/model).
# A target sees `#include "model/..."` only when it links nsa_model, directly or through a layer
# above; an upward include (a model file including "train/...") fails to compile.
function(nsa_layer_root target)
  set(root "${PROJECT_BINARY_DIR}/layer_roots/${target}")
  file(MAKE_DIRECTORY "${root}")
  set(args ${ARGN})
  while(args)
    list(POP_FRONT args name dir)
    file(CREATE_LINK "${dir}" "${root}/${name}" SYMBOLIC)
  endwhile()
  target_include_directories(${target} PUBLIC "${root}")
endfunction()
