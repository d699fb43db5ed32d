// Compiles the shared precompiled header (<torch/torch.h>) that every target reuses.
