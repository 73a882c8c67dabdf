"""The pinned llama.cpp: build, libllama, llama-server, hardware, doctor."""
