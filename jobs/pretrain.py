"""Ray job entrypoint: the whole pipeline: tokenizer, shards, training, export.

    ray job submit --working-dir . -- python jobs/pretrain.py --config jobs/configs/quickstart.yaml
"""

import sys

from _entry import main

if __name__ == "__main__":
    sys.exit(main("pretrain"))
