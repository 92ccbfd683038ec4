// A shared library that looks like a plugin file but exports no sapipe_plugin_entry: the loader
// must report the missing symbol by name.
extern "C" __attribute__((visibility("default"))) int sapipe_not_an_entry(void) { return 0; }
