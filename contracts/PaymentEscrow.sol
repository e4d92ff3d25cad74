// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

import {Ownable} from "@openzeppelin/contracts/access/Ownable.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {Address} from "@openzeppelin/contracts/utils/Address.sol";
import {IPaymentEscrow} from "./interfaces/IPaymentEscrow.sol";
import {OneTimeWiring} from "./lib/OneTimeWiring.sol";

/// @title PaymentEscrow
/// @notice Holds every wei of Quarry: client payments per task (`escrowed`) and every amount
/// credited to an account (`withdrawable`), which the account pulls with {withdraw}.
/// Invariant: `address(this).balance == totalEscrowed + totalWithdrawable` at every step.
/// @dev No constructor parameters; the owner (deployer) wires the four Quarry contracts once.
contract PaymentEscrow is IPaymentEscrow, Ownable, ReentrancyGuard, OneTimeWiring {
    /// @notice Wei held for each task, released by TaskRegistry or Arbitration.
    mapping(uint256 taskId => uint256) public escrowed;
    /// @notice Wei each account may pull with {withdraw}.
    mapping(address account => uint256) public withdrawable;
    /// @notice Sum of `escrowed` over all tasks.
    uint256 public totalEscrowed;
    /// @notice Sum of `withdrawable` over all accounts.
    uint256 public totalWithdrawable;

    address public taskRegistry;
    address public arbitration;
    address public gpuRegistry;
    address public committee;

    event TaskRegistrySet(address taskRegistry);
    event ArbitrationSet(address arbitration);
    event GPURegistrySet(address gpuRegistry);
    event CommitteeSet(address committee);
    /// @notice A task's payment entered escrow.
    event Deposited(uint256 indexed taskId, uint256 amount);
    /// @notice Escrowed wei of a task became withdrawable by `to`.
    event Released(uint256 indexed taskId, address indexed to, uint256 amount);
    /// @notice Incoming wei (slashed stake, bonds) from a Quarry contract became withdrawable by `to`.
    event Credited(address indexed from, address indexed to, uint256 amount);
    /// @notice `account` pulled its withdrawable balance.
    event Withdrawn(address indexed account, uint256 amount);

    /// @notice The caller is not the Quarry contract allowed to do this.
    error Unauthorized(address caller);
    /// @notice A release asks for more than the task holds.
    error InsufficientEscrow(uint256 taskId, uint256 available, uint256 requested);
    /// @notice {withdraw} with nothing to withdraw.
    error NothingToWithdraw();
    /// @notice {deposit} without value.
    error ZeroAmount();

    constructor() Ownable(msg.sender) {}

    // ------------------------------------------------------------------ wiring

    /// @notice Sets TaskRegistry (may deposit and release). One-time, owner only.
    function setTaskRegistry(address a) external onlyOwner setOnce(taskRegistry, a) {
        taskRegistry = a;
        emit TaskRegistrySet(a);
    }

    /// @notice Sets Arbitration (may release and credit). One-time, owner only.
    function setArbitration(address a) external onlyOwner setOnce(arbitration, a) {
        arbitration = a;
        emit ArbitrationSet(a);
    }

    /// @notice Sets GPURegistry (may credit slashed stake). One-time, owner only.
    function setGPURegistry(address a) external onlyOwner setOnce(gpuRegistry, a) {
        gpuRegistry = a;
        emit GPURegistrySet(a);
    }

    /// @notice Sets VerifierCommittee (may credit slashed verifier stake). One-time, owner only.
    function setCommittee(address a) external onlyOwner setOnce(committee, a) {
        committee = a;
        emit CommitteeSet(a);
    }

    // ------------------------------------------------------------------ value flows

    /// @notice Puts `msg.value` into escrow for `taskId`. TaskRegistry only.
    /// @param taskId The task the payment belongs to.
    function deposit(uint256 taskId) external payable {
        if (msg.sender != taskRegistry || msg.sender == address(0)) revert Unauthorized(msg.sender);
        if (msg.value == 0) revert ZeroAmount();
        escrowed[taskId] += msg.value;
        totalEscrowed += msg.value;
        emit Deposited(taskId, msg.value);
    }

    /// @notice Moves `amount` escrowed wei of `taskId` into `withdrawable[to]`.
    /// TaskRegistry or Arbitration only. A zero amount is a no-op.
    /// @param taskId The task whose escrow pays.
    /// @param to The account credited.
    /// @param amount Wei to move.
    function release(uint256 taskId, address to, uint256 amount) external {
        if (msg.sender == address(0) || (msg.sender != taskRegistry && msg.sender != arbitration)) {
            revert Unauthorized(msg.sender);
        }
        if (to == address(0)) revert ZeroAddress();
        if (amount == 0) return;
        uint256 available = escrowed[taskId];
        if (amount > available) revert InsufficientEscrow(taskId, available, amount);
        escrowed[taskId] = available - amount;
        totalEscrowed -= amount;
        withdrawable[to] += amount;
        totalWithdrawable += amount;
        emit Released(taskId, to, amount);
    }

    /// @notice Credits the incoming `msg.value` to `withdrawable[to]` (slashed stake, bonds).
    /// Callable by the other Quarry contracts only. A zero value is a no-op.
    /// @param to The account credited.
    function credit(address to) external payable {
        if (
            msg.sender == address(0)
                || (
                    msg.sender != taskRegistry && msg.sender != arbitration && msg.sender != gpuRegistry
                        && msg.sender != committee
                )
        ) revert Unauthorized(msg.sender);
        if (to == address(0)) revert ZeroAddress();
        if (msg.value == 0) return;
        withdrawable[to] += msg.value;
        totalWithdrawable += msg.value;
        emit Credited(msg.sender, to, msg.value);
    }

    /// @notice Sends the caller its whole withdrawable balance (pull payment).
    function withdraw() external nonReentrant {
        uint256 amount = withdrawable[msg.sender];
        if (amount == 0) revert NothingToWithdraw();
        withdrawable[msg.sender] = 0;
        totalWithdrawable -= amount;
        emit Withdrawn(msg.sender, amount);
        Address.sendValue(payable(msg.sender), amount);
    }
}
