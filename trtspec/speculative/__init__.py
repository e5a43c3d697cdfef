"""The speculative decoding algorithm, usable on its own: no CLI, build, server or bench imports."""
