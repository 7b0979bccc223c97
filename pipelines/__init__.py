"""The tasks (classify, lm, translate, tag on one spine; documents, ctr, lm with truncated BPTT)
and their registry; installed as ``tfseq.pipelines``."""
