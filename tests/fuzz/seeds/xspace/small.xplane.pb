
/host:metadata