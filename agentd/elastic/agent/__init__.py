"""``torch.distributed.elastic.agent``."""
