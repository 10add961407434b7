#!/usr/bin/env bash
# RDK vs vanilla pruned sampling: kernels fitted, scored and generated (docs/results/rdk-acceptance-vs-kept-size-*-DATE.{md,png}).
source "$(dirname "$0")/_common.sh"
hf-vocabspec rdk-bench --target offline:gemma-3-270m --temperatures 1.0 0.7 --output results/rdk-gemma
hf-vocabspec rdk-bench --target offline:smollm2-135m-instruct --temperatures 1.0 --output results/rdk-smollm2
publish results/rdk-gemma/results.md "rdk-acceptance-vs-kept-size-gemma-$DATE.md"
publish results/rdk-gemma/rdk_tau_vs_vocab.png "rdk-acceptance-vs-kept-size-gemma-t1-$DATE.png"
publish results/rdk-smollm2/results.md "rdk-acceptance-vs-kept-size-smollm2-$DATE.md"
publish results/rdk-smollm2/rdk_tau_vs_vocab.png "rdk-acceptance-vs-kept-size-smollm2-t1-$DATE.png"
