"""One module per architecture tk exports, each registering its entry with toolkit.core.architectures, which finds
and imports every module here (nothing lists them)."""
