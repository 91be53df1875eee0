"""Starting ranks: `local` starts N ranks on this machine with the torchrun environment
(CPU ranks forked from a warm server, `forked`, which imported once what every rank needs:
`warm`); `worker` is the per-rank main that runs unchanged under the local launcher or
`torchrun`; `external` gathers what ranks started elsewhere wrote."""
