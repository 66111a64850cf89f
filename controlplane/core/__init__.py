"""Pure decisions: frozen Structs in, frozen results with a code out. No I/O, no clock."""
