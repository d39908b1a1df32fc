"""``python -m numbaconv.bench``: the same as ``numbaconv bench``."""
import sys

from .cli import main, parse_args

sys.exit(main(parse_args()))
