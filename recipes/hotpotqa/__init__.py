"""Recipe: multi-hop retrieval QA in HotpotQA's format (``recipes/hotpotqa/README.md``)."""
