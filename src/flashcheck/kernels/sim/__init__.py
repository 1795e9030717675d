"""The attention simulators: FP64 reference, standard, Flash (FA1/FA2), FP8 / quantised / split-KV, presets."""
