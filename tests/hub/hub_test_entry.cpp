// Entry of one hub test artifact: its op namespace (TORCH_EXTENSION_NAME, as kernel-builder
// passes it), its failure mode, and the `PyInit_<name>` every Hub build has (REGISTER_EXTENSION):
// it references PyModule_Create2 and the library is linked with -z now, so it only loads where
// that symbol exists (libreyolo_kernels' stub), like a BIND_NOW build from the Hub.
#define HUBTEST_CAT2(a, b) a##b
#define HUBTEST_CAT(a, b) HUBTEST_CAT2(a, b)
#define HUBTEST_STR2(x) #x
#define HUBTEST_STR(x) HUBTEST_STR2(x)

extern "C" void* PyModule_Create2(void* module_def, int api_version);
void libreyolo_hubtest_register(const char* ns, int mode, int throw_at);

extern "C" __attribute__((visibility("default"))) void* HUBTEST_CAT(PyInit_,
                                                                    TORCH_EXTENSION_NAME)() {
  return PyModule_Create2(nullptr, 3);
}

namespace {
const bool registered = (libreyolo_hubtest_register(HUBTEST_STR(TORCH_EXTENSION_NAME),
                                                    HUB_TEST_MODE, HUB_TEST_THROW_AT),
                         true);
}  // namespace
