"""The gRPC entrance (`srt-serve --grpc-mode`): SGLang's scheduler service, token ids in and
out, for sglang-router's gRPC workers (docs/scale-out.md)."""
