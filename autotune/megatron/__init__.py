"""Everything that speaks Megatron-Bridge: the knob -> override mapping (`overrides`), the offline
Hugging Face config the worker builds the recipe from (`hf_config`), Megatron's log formats
(`logparse`), Nsight Systems trace summaries (`trace`) and the client of the megatron-probe side
environment (`probe_client`). Nothing here imports Megatron-Bridge itself: only `workers/` does, lazily."""
