// The pure client logic of Tether (no I/O): see ARCHITECTURE in docs/architecture.md.
