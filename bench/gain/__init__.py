"""Does a pool help a few-shot classifier? The protocols `genaug gain` measures, and the
generator they depend on."""
