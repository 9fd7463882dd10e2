"""Wire schemas (msgspec Structs) of the HTTP surfaces, shared by surfaces, the HTTP app and the OpenAPI document."""
