"""``numbaconv bench`` (placeholder until the benchmark lands)."""


def add_arguments(parser):
    parser.add_argument("--suite", default="resnet50")


def main(args):
    print("numbaconv bench: not available yet")
    return 1
