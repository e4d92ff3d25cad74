// SPDX-License-Identifier: MIT
pragma solidity ^0.8.24;

/// @notice What the other Quarry contracts need from PaymentEscrow.
interface IPaymentEscrow {
    function deposit(uint256 taskId) external payable;
    function release(uint256 taskId, address to, uint256 amount) external;
    function credit(address to) external payable;
    function escrowed(uint256 taskId) external view returns (uint256);
}
