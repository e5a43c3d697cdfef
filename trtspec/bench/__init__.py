"""`trtspec bench`: client-side load tests of a served deployment (Triton gRPC/HTTP, OpenAI)."""
