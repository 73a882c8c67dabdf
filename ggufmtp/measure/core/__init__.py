"""What every measurement shares: prompt suites, bootstrap statistics, the paired-arm (ABBA) runner,
the arms' server options (:mod:`ggufmtp.measure.core.options`) and the records of the model and
server measured."""
