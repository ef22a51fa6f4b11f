/*
 * The Linux block layer's persistent reservation ioctls (<linux/pr.h>) on one device,
 * for tests/interop/test_linux_host_reservations.py: the kernel's NVMe host turns them
 * into Reservation Register/Acquire/Release commands itself (pr_ops), unlike nvme-cli,
 * which passes the commands through.
 *
 *   prtool DEV register OLD NEW [IGNORE]   prtool DEV reserve KEY TYPE
 *   prtool DEV release KEY TYPE            prtool DEV preempt OLD NEW TYPE [ABORT]
 *   prtool DEV clear KEY
 *
 * Prints "rc=0x..." (the ioctl's return: an NVMe status on Linux 6.1) and exits 0 only
 * when it is 0.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/pr.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

static unsigned long long arg(int argc, char **argv, int i)
{
	return i < argc ? strtoull(argv[i], NULL, 0) : 0;
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: prtool DEV OPERATION KEY...\n");
		return 2;
	}
	int fd = open(argv[1], O_RDWR);
	if (fd < 0) {
		perror(argv[1]);
		return 2;
	}
	const char *op = argv[2];
	unsigned long long a = arg(argc, argv, 3), b = arg(argc, argv, 4);
	unsigned long long c = arg(argc, argv, 5);
	int rc;
	if (!strcmp(op, "register")) {
		struct pr_registration r = { .old_key = a, .new_key = b };
		r.flags = c ? PR_FL_IGNORE_KEY : 0;
		rc = ioctl(fd, IOC_PR_REGISTER, &r);
	} else if (!strcmp(op, "reserve") || !strcmp(op, "release")) {
		struct pr_reservation r = { .key = a, .type = (unsigned)b };
		rc = ioctl(fd, op[2] == 's' ? IOC_PR_RESERVE : IOC_PR_RELEASE, &r);
	} else if (!strcmp(op, "preempt")) {
		struct pr_preempt p = { .old_key = a, .new_key = b, .type = (unsigned)c };
		rc = ioctl(fd, arg(argc, argv, 6) ? IOC_PR_PREEMPT_ABORT : IOC_PR_PREEMPT, &p);
	} else if (!strcmp(op, "clear")) {
		struct pr_clear cl = { .key = a };
		rc = ioctl(fd, IOC_PR_CLEAR, &cl);
	} else {
		fprintf(stderr, "unknown operation %s\n", op);
		return 2;
	}
	if (rc < 0)
		printf("rc=-1 errno=%d (%s)\n", errno, strerror(errno));
	else
		printf("rc=%#x\n", rc);
	return rc != 0;
}
