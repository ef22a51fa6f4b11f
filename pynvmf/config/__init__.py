"""Configuration at the edge: the three file formats a target is described in, and what
they share.

- `native`: pynvmf's own JSON file (`pynvmf target --config`, pynvmf_get_config).
- `spdk`: SPDK's save_config/load_config format (`pynvmf target --json`).
- `nvmetcli`: nvmetcli's file, the Linux target's configfs as JSON.
- `files`: replacing a file so that a crash leaves the old one or the new one.
"""
