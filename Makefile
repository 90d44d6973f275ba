.PHONY: run test
run:
	scripts/run
test:
	scripts/test
