#ifndef CTETHER_NETLINK_H
#define CTETHER_NETLINK_H
// Linux rtnetlink definitions for Tether's network monitor (link/address/route change events).
#ifdef __linux__
#include <sys/socket.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/if.h>

/// Size of the netlink message header, aligned (NLMSG_HDRLEN is a macro Swift cannot import).
static inline unsigned int ctether_nlmsg_hdrlen(void) { return NLMSG_HDRLEN; }
/// NLMSG_ALIGN as a function.
static inline unsigned int ctether_nlmsg_align(unsigned int len) { return NLMSG_ALIGN(len); }
#endif
#endif
