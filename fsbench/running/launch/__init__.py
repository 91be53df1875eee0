"""Starting ranks: `local` spawns N ranks on this machine with the torchrun environment;
`worker` is the per-rank main that runs unchanged under the local launcher or `torchrun`."""
