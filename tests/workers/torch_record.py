"""A worker whose main is decorated with torch's own @record."""

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    raise RuntimeError("torch-recorded failure: loss is NaN")


if __name__ == "__main__":
    main()
