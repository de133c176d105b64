"""Scale out: the job's process group (env), FSDP2 (fsdp), expert parallel (ep), gradient clipping
over sharded parameters (grad), and what each rank of a launch writes where (launch)."""
