#!/usr/bin/env bash
# `make demo`'s output (README "Two commands"): count -> trim -> save -> reload -> generate, 3 methods side by side.
source "$(dirname "$0")/_common.sh"
hf-vocabspec demo --strict --output results/demo
