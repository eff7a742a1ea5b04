// A harmless `PyModule_Create2`, exported from libreyolo_kernels.
//
// Hub kernels are Python extension modules built against the limited API: their `PyInit_<id>`
// (never called here: the ops register from static initialisers) references PyModule_Create2.
// Builds linked with immediate binding (-z now, nixpkgs' default hardening) fail to dlopen in a
// process without libpython unless the symbol exists (hf-kernels-hub.md section 4.6). This
// definition satisfies the dynamic linker; calling it returns NULL, Python's error value.
extern "C" __attribute__((visibility("default"))) void* PyModule_Create2(void* /*module_def*/,
                                                                         int /*api_version*/) {
  return nullptr;
}
