"""The HTTP server (docs/design.md §6): SGLang's native API, the OpenAI API, operations routes
and the browser playground, on aiohttp in the main process beside the TokenizerManager."""
